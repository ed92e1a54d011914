// Run by scripts/docs.py in headless Chromium (a harness page loads each page of the site in a 1280 px iframe):
// every code block's widest line measured against its box. A block is cut when its content is wider than its box
// (it neither wraps nor fits); a line of at most 120 characters that has to wrap means the column is too narrow.
function measureCode(d) {
  const bad = [];
  d.querySelectorAll('main pre').forEach((pre, k) => {
    if (!pre.getClientRects().length) return;  // not shown (a folded part of the page)
    const cs = d.defaultView.getComputedStyle(pre);
    const pad = parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight);
    const c = pre.cloneNode(true);  // the block unwrapped: its widest line's width
    Object.assign(c.style, {position: 'absolute', visibility: 'hidden', whiteSpace: 'pre', width: 'max-content',
                            maxWidth: 'none', overflow: 'visible', left: '0', top: '0'});
    d.body.appendChild(c);
    const natural = c.scrollWidth;
    c.remove();
    const lines = pre.textContent.replace(/\n$/, '').split('\n');
    const longest = lines.reduce((a, l) => l.length > a.length ? l : a, '');
    const box = pre.clientWidth, chw = longest.length ? (natural - pad) / longest.length : 8;
    const cap = Math.floor((box - pad) / chw + 0.05);
    const cut = pre.scrollWidth > pre.clientWidth + 1;
    const where = (pre.closest('[id]') || {}).id || '';
    if (cut) bad.push({kind: 'cut', block: k, chars: longest.length, cap, where, line: longest.trim().slice(0, 70)});
    else if (natural > box + 1 && longest.length <= 120)
      bad.push({kind: 'narrow', block: k, chars: longest.length, cap, where, line: longest.trim().slice(0, 70)});
  });
  return bad;
}
