// Longrun console: progressive enhancement only. Pages work without this
// file; with it, the rows of a list (and an operation's page) follow the
// operations' changes through /ui/live, a server-sent event stream.
"use strict";

function follow(ids, onChange) {
  if (!ids.length || !window.EventSource) return;
  const source = new EventSource("/ui/live?ids=" + encodeURIComponent(ids.join(",")));
  source.addEventListener("change", (e) => onChange(JSON.parse(e.data)));
}

function setState(cell, state) {
  cell.textContent = state;
  cell.className = "state state-" + state;
}

document.addEventListener("DOMContentLoaded", () => {
  const rows = document.querySelector('[data-live="rows"]');
  if (rows) {
    const byId = new Map();
    rows.querySelectorAll("tr[data-id]").forEach((tr) => byId.set(tr.dataset.id, tr));
    follow([...byId.keys()], (change) => {
      const tr = byId.get(change.id);
      if (!tr || Number(tr.dataset.version) >= change.version) return;
      tr.dataset.version = change.version;
      const cell = tr.querySelector('[data-field="state"]');
      if (cell) setState(cell, change.state);
      tr.classList.remove("changed");
      void tr.offsetWidth;
      tr.classList.add("changed");
    });
  }
  const one = document.querySelector('[data-live="operation"]');
  if (one) {
    follow([one.dataset.id], (change) => {
      if (Number(one.dataset.version) >= change.version) return;
      one.dataset.version = change.version;
      const badge = document.querySelector("h1 [data-field=state]");
      if (badge) setState(badge, change.state);
      const note = one.querySelector(".live-note");
      if (note) note.hidden = false;
    });
  }
});
