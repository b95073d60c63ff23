// The log box, and every output shown by its end, open scrolled to the end: the latest lines
// (the tests, the final status, the agent's last words) are what an operator reads first.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".te-tail").forEach(function (pre) {
    pre.scrollTop = pre.scrollHeight;
  });
});
