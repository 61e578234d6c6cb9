// Live refresh: every data-refresh seconds (0: never), fetch this page again and swap its
// <main>, keeping the scroll position; the whole page reloads if the fetch fails.
(function () {
  const seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  async function refresh() {
    try {
      const reply = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
      if (!reply.ok) throw new Error(String(reply.status));
      const page = new DOMParser().parseFromString(await reply.text(), "text/html");
      document.getElementById("live").replaceWith(page.getElementById("live"));
      document.body.dataset.refresh = page.body.dataset.refresh;
      document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      location.reload();
      return;
    }
    const next = Number(document.body.dataset.refresh || 0);
    if (next) setTimeout(refresh, next * 1000);
  }
  setTimeout(refresh, seconds * 1000);
})();
