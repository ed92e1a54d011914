// The site's search (the pandoc stand-in's; Quarto has its own): the box in the navbar searches every page's text, its
// headings and titles, from search_index.js, which `make site` writes (scripts/docs.py) and this loads at the first key.
// Works from file:// as from a server. `/` focuses the box, Enter opens the first result; `?q=word` searches on load.
(function () {
  const box = document.getElementById('search-box'), out = document.getElementById('search-results');
  if (!box) return;
  const root = document.body.dataset.root || '';
  let loading = null;
  function load() {
    if (window.SEARCH_INDEX) return Promise.resolve();
    if (!loading) loading = new Promise((ok, fail) => {
      const s = document.createElement('script'); s.src = root + 'search_index.js'; s.onload = ok; s.onerror = fail;
      document.head.appendChild(s); });
    return loading;
  }
  const esc = t => t.replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
  function search(terms) {
    const hits = [];
    for (const p of window.SEARCH_INDEX) {
      const title = p.t.toLowerCase(), text = p.x.toLowerCase();
      let score = 0, anchor = '', label = '', all = true;
      for (const t of terms) {
        let s = title.includes(t) ? 20 : 0;
        for (const [id, h] of p.h) {
          const hl = h.toLowerCase();
          if (hl === t || hl.includes(t)) { s += hl === t ? 60 : 5; if (!anchor || hl === t) { anchor = id; label = h; } }
        }
        for (let n = 0, i = text.indexOf(t); i >= 0 && n < 30; i = text.indexOf(t, i + 1), n++) s += 1;
        if (!s) { all = false; break; }
        score += s;
      }
      if (all) hits.push({p, score, anchor, label});
    }
    return hits.sort((a, b) => b.score - a.score).slice(0, 12);
  }
  function snippet(p, t) {
    const i = p.x.toLowerCase().indexOf(t);
    if (i < 0) return p.x.slice(0, 140);
    const a = Math.max(0, i - 60);
    return (a ? '…' : '') + p.x.slice(a, i + 100) + '…';
  }
  function show() {
    const q = box.value.trim();
    if (!q) { out.hidden = true; out.innerHTML = ''; return; }
    load().then(() => {
      if (box.value.trim() !== q) return;
      const terms = q.toLowerCase().split(/\s+/).filter(Boolean), hits = search(terms);
      out.innerHTML = hits.length ? hits.map(h =>
        `<a href="${root}${h.p.u}${h.anchor ? '#' + h.anchor : ''}"><b>${esc(h.p.t)}</b>` +
        `${h.label && h.label !== h.p.t ? ' › ' + esc(h.label) : ''}<span>${esc(snippet(h.p, terms[0]))}</span></a>`).join('')
        : `<div class="none">No page has “${esc(q)}”.</div>`;
      out.hidden = false;
    }, () => { out.innerHTML = '<div class="none">The search index (search_index.js) is missing: run `make site`.</div>'; out.hidden = false; });
  }
  box.addEventListener('input', show);
  box.addEventListener('keydown', e => {
    if (e.key === 'Enter') { const a = out.querySelector('a'); if (a) location.href = a.href; }
    if (e.key === 'Escape') { box.value = ''; show(); box.blur(); }
  });
  document.addEventListener('keydown', e => {
    if (e.key === '/' && document.activeElement !== box) { e.preventDefault(); box.focus(); } });
  document.addEventListener('click', e => { if (!out.contains(e.target) && e.target !== box) out.hidden = true; });
  const q = new URLSearchParams(location.search).get('q');
  if (q) { box.value = q; show(); }
})();
