// The console's only script (no inline script: the Content-Security-Policy forbids it).
// It follows the page's event stream, where the server sends a region again, whole, when
// it changed (already escaped HTML, rendered by the server), filters the overview, and
// posts a person's actions with the page's CSRF token.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const live = document.getElementById("live");
  const flash = document.getElementById("flash");

  function say(text, failed) {
    flash.textContent = text;
    flash.className = failed ? "failed" : "ok";
  }

  // -- the filter: rows whose text holds what is typed stay shown ---------------------
  const filter = document.getElementById("filter");
  function applyFilter() {
    if (!filter) return;
    const wanted = filter.value.trim().toLowerCase().replace(/\s+/g, " ");
    for (const row of document.querySelectorAll("tr.child, ul.tree li")) {
      row.hidden = !row.textContent.toLowerCase().replace(/\s+/g, " ").includes(wanted);
    }
  }
  if (filter) filter.addEventListener("input", applyFilter);

  // -- the stream ---------------------------------------------------------------------
  const stream = document.body.dataset.stream;
  if (stream) {
    const source = new EventSource(stream);
    source.addEventListener("region", (event) => {
      const update = JSON.parse(event.data);
      const region = document.getElementById(update.id);
      if (!region) return;
      // Keep what a person is typing into a field of the region being replaced.
      const typing = document.activeElement && region.contains(document.activeElement)
        ? document.activeElement : null;
      const kept = typing && typing.id ? [typing.id, typing.value] : null;
      region.innerHTML = update.html;
      if (kept) {
        const again = document.getElementById(kept[0]);
        if (again) { again.value = kept[1]; again.focus(); }
      }
      applyFilter();
    });
    source.addEventListener("live", () => {
      live.textContent = "live";
      live.className = "live on";
      document.body.dataset.updated = String(Date.now());
    });
    source.addEventListener("problem", (event) => {
      say(JSON.parse(event.data).message, true);
    });
    source.onerror = () => {
      live.textContent = "reconnecting…";
      live.className = "live off";
    };
  }

  // -- actions: a button names its POST, its fixed body and the fields it sends ------
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-post]");
    if (!button) return;
    event.preventDefault();
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    const body = button.dataset.body ? JSON.parse(button.dataset.body) : {};
    for (const id of (button.dataset.fields || "").split(",").filter(Boolean)) {
      const field = document.getElementById(id);
      if (field && field.value !== "") body[id] = field.value;
    }
    button.disabled = true;
    try {
      const answer = await fetch(button.dataset.post, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: JSON.stringify(body),
      });
      const reply = await answer.json().catch(() => ({}));
      if (!answer.ok) {
        say(`${button.textContent}: ${reply.message || answer.statusText}`, true);
        return;
      }
      if (reply.said) {
        const result = document.getElementById("send-result");
        if (result) result.textContent = `Sent: ${reply.said} (task ${reply.task_id}).`;
      }
      say(`${button.textContent}: done.`, false);
      for (const id of (button.dataset.clear || "").split(",").filter(Boolean)) {
        const field = document.getElementById(id);
        if (field) field.value = "";
      }
    } catch (error) {
      say(`${button.textContent}: ${error}`, true);
    } finally {
      button.disabled = false;
    }
  });
})();
