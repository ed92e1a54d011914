#!/usr/bin/env python
"""Write README.md from nbs/index.ipynb and CONTRIBUTING.md from nbs/guides/contributing.ipynb (what `nbdev-readme`
does for the first, without Quarto).

Markdown cells are copied as they are; code cells become ```python blocks with their
`#|` directive lines removed; cells are separated by a blank line; images beside the notebook (`images/x.png`)
are named from the repository's root (`nbs/images/x.png`), where the Markdown file is.
`--check` writes nothing and exits 1 when a Markdown file differs from its notebook.
"""
import argparse, json, re, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
PAGES = {'README.md': root/'nbs'/'index.ipynb', 'CONTRIBUTING.md': root/'nbs'/'guides'/'contributing.ipynb'}

def readme_text(nb_path):
    nb_path = Path(nb_path)
    cells = json.loads(nb_path.read_text())['cells']
    rel = nb_path.resolve().parent.relative_to(root).as_posix() if nb_path.resolve().is_relative_to(root) else ''
    parts = []
    for c in cells:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown':
            parts.append(re.sub(r'(!\[[^\]]*\]\()(?![a-z]+:|/)([^)\s]+)', lambda m: f'{m[1]}{rel}/{m[2]}' if rel else m[0], src))
        elif c['cell_type'] == 'code':
            code = '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith('#|')).strip('\n')
            if code: parts.append(f'```python\n{code}\n```')
    return '\n\n'.join(p for p in parts if p) + '\n'

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--check', action='store_true', help='only check that README.md and CONTRIBUTING.md match their notebooks')
    args = p.parse_args()
    bad = []
    for name, nb in PAGES.items():
        text, md = readme_text(nb), root/name
        if args.check:
            if md.exists() and md.read_text() == text: print(f'>>> {name} matches {nb.relative_to(root)}')
            else: bad.append(f'!!! {name} differs from {nb.relative_to(root)}: edit the notebook, then run `make readme`.')
        else:
            md.write_text(text); print(f'wrote {md} from {nb.relative_to(root)}')
    if bad: sys.exit('\n'.join(bad))
