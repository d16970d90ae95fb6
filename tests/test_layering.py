"""The packages of mortal/ form layers: no two rooms (a subpackage, or a top-level module) import each other, not even
lazily inside a function. Read from the source with ast; nothing is imported."""

import ast
import collections
import pathlib

from conftest import ROOT



def room_imports(root: pathlib.Path) -> dict:
    """``{(room, other room): {'module -> imported', ...}}`` for every import in ``root`` (the ``mortal`` folder)."""
    tops = {p.stem for p in root.glob('*.py')} | {p.name for p in root.iterdir() if (p / '__init__.py').exists()}

    def room(name):
        parts = name.split('.')
        if parts[0] != 'mortal':
            return None
        return 'mortal.' + parts[1] if len(parts) > 1 and parts[1] in tops else 'mortal'

    edges = collections.defaultdict(set)
    for p in root.rglob('*.py'):
        name = '.'.join(p.relative_to(root.parent).with_suffix('').parts).removesuffix('.__init__')
        package = name if p.name == '__init__.py' else name.rsplit('.', 1)[0]
        for node in ast.walk(ast.parse(p.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = package.split('.')[:len(package.split('.')) - node.level + 1]
                    base = '.'.join(parts + ([base] if base else []))
                targets = [f'{base}.{a.name}' for a in node.names] if base == 'mortal' else [base]
            else:
                continue
            for target in targets:
                other = room(target)
                if other and other != room(name):
                    edges[(room(name), other)].add(f'{name} -> {target}')
    return edges


def test_no_two_rooms_import_each_other():
    edges = room_imports(ROOT / 'mortal')
    pairs = {tuple(sorted(k)) for k in edges if (k[1], k[0]) in edges}
    assert not pairs, {p: sorted(edges[p] | edges[p[::-1]]) for p in pairs}


def test_the_check_sees_lazy_imports(tmp_path):
    pkg = tmp_path / 'mortal'
    for d in ('a', 'b'):
        (pkg / d).mkdir(parents=True)
        (pkg / d / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text('')
    (pkg / 'a' / 'x.py').write_text('from mortal.b import y\n')
    (pkg / 'b' / 'y.py').write_text('def f():\n    from ..a import x\n')
    edges = room_imports(pkg)
    assert ('mortal.a', 'mortal.b') in edges and ('mortal.b', 'mortal.a') in edges
