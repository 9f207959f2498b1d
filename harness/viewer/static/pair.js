/* The exported side-by-side: shows runs/<a>.html and runs/<b>.html, names taken from the address (plain names only). */
(function () {
  "use strict";
  var params = new URLSearchParams(window.location.search);
  ["a", "b"].forEach(function (key) {
    var name = params.get(key) || "";
    if (/^[A-Za-z0-9_-]{1,64}$/.test(name)) { document.getElementById("side-" + key).src = "runs/" + name + ".html#embed"; }
  });
})();
