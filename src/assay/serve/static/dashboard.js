// The dashboard's only script: draw image inputs, and keep the counts live.
(function () {
  "use strict";
  document.querySelectorAll("canvas.digit").forEach(function (canvas) {
    var shape = JSON.parse(canvas.dataset.shape), pixels = JSON.parse(canvas.dataset.pixels);
    var low = parseFloat(canvas.dataset.low), high = parseFloat(canvas.dataset.high);
    var height = shape[0], width = shape[1], channels = shape[2] || 1, span = high > low ? high - low : 1;
    canvas.width = width; canvas.height = height;
    var context = canvas.getContext("2d"), image = context.createImageData(width, height);
    var difference = canvas.classList.contains("difference"), alert = [194, 65, 12];
    for (var i = 0; i < width * height; i++) {
      for (var c = 0; c < 3; c++) {
        var value = pixels[i * channels + (channels === 3 ? c : 0)], level = (value - low) / span;
        // Pixels as grey levels; the difference map in the alert colour over white, by how much they differ.
        image.data[4 * i + c] = difference ? Math.round(255 + level * (alert[c] - 255)) : Math.round(255 * level);
      }
      image.data[4 * i + 3] = 255;
    }
    context.putImageData(image, 0, 0);
  });

  var monitor = document.getElementById("monitor");
  if (!monitor) return;
  var name = monitor.dataset.name, shown = parseInt(monitor.dataset.flagged, 10);
  function set(id, value) { var node = document.getElementById(id); if (node) node.textContent = value; }
  function poll() {
    fetch("/api/monitors/" + encodeURIComponent(name) + "/stats", {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (stats) {
        if (!stats) return;
        set("count-decisions", stats.decisions.toLocaleString("en"));
        set("count-flagged", stats.flagged.toLocaleString("en"));
        set("count-pairs", stats.pairs.toLocaleString("en"));
        set("rate", stats.decisions ? (100 * stats.flagged / stats.decisions).toFixed(2) : "0.00");
        if (stats.flagged > shown) {
          set("fresh-count", (stats.flagged - shown).toLocaleString("en"));
          document.getElementById("fresh").hidden = false;
        }
      })
      .catch(function () {});
  }
  setInterval(poll, 2000);
})();
