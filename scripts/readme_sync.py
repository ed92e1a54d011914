#!/usr/bin/env python
"""Write README.md from nbs/index.ipynb (what `nbdev-readme` does, without Quarto).

Markdown cells are copied as they are; code cells become ```python blocks with their
`#|` directive lines removed; cells are separated by a blank line.
`--check` writes nothing and exits 1 when README.md differs from the notebook.
"""
import argparse, json, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent

def readme_text(nb_path):
    cells = json.loads(Path(nb_path).read_text())['cells']
    parts = []
    for c in cells:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown': parts.append(src)
        elif c['cell_type'] == 'code':
            code = '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith('#|')).strip('\n')
            if code: parts.append(f'```python\n{code}\n```')
    return '\n\n'.join(p for p in parts if p) + '\n'

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--check', action='store_true', help='only check that README.md matches nbs/index.ipynb')
    args = p.parse_args()
    text, readme = readme_text(root/'nbs'/'index.ipynb'), root/'README.md'
    if args.check:
        if readme.exists() and readme.read_text() == text: print('>>> README.md matches nbs/index.ipynb')
        else:
            sys.exit('!!! README.md differs from nbs/index.ipynb: edit the notebook, then run `make readme`.')
    else:
        readme.write_text(text); print(f'wrote {readme} from nbs/index.ipynb')
