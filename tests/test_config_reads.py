"""One way to read the config: outside mortal/config.py no module indexes the plain config dict or calls ``.get`` on
it; processes and library modules read typed sections (``mortal.config.typed`` / ``section``), whose defaults are
the schema's (mortal/config_schema.py). A default written in ``.get(key, default)`` would be a second definition of
it. Read from the source with ast; nothing is imported."""

import ast
import pathlib
import re

from conftest import ROOT

# The names a config dict or one of its tables travels under, alone or as a word of a snake_case name: config,
# cfg, conf (self.config, ckpt_cfg, server_cfg; config_path is no dict, and is never indexed either), and those of
# a table handed down: section, table, slot (a [baseline.*]), side (a [1v3.*]), ds (a [dataset]).
CONFIG_NAME = re.compile(r'(^|_)(config|cfg|conf|section|table|slot|side|ds)(_|$)')
# The top-level tables ([1v3] included): indexing anything by one of these names reads a config table, whatever
# the dict is called (grp['control'], tomllib.loads(text).get('env')). Not 'guard', 'online' and 'test_play', which
# also name entries of other dicts (a checkpoint's guard state, the quickstart's timings and results); a config
# table of those names is caught by the dict's name.
SECTION_KEYS = frozenset({'control', 'train_play', 'dataset', 'env', 'resnet', 'cql', 'aux', 'freeze_bn', 'optim',
                          'baseline', '1v3', 'grp', 'fleet', 'bootstrap'})
# Where the plain dict must be read, by (file, function), each with why. Keep it short.
ALLOWED = {
    ('mortal/config.py', '*'): 'the loader, its checks and the typed accessors themselves',
    ('mortal/model/checkpoint.py', 'arch_of'): "a checkpoint's state['config'], Mortal's plain dict as saved (any "
                                               'writer, any version; version 1 when [control] has none, as Mortal)',
}


def _name(node) -> str | None:
    """The name a receiver goes by: ``config`` for ``config``, ``self.config`` and ``t.config``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _key(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def config_reads(source: str) -> list[tuple[str, int, str]]:
    """``(function, line, code)`` of every read of a plain config dict in ``source``: a subscript of a config-named
    value (``config['control']``, ``cfg['log_dir'] = x``), a ``.get`` on one (``cfg.get('token')``,
    ``ckpt_cfg.get('control', {})``), or a subscript or ``.get`` of anything by a top-level table's name
    (``grp['dataset']``, ``x.get('env', {})``); a chain is one read, found at its first step. ``function`` is the
    qualified name of the enclosing function ('' at module level)."""
    found = []

    def visit(node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f'{scope}.{node.name}' if scope else node.name
        hit = False
        if isinstance(node, ast.Subscript):
            hit = bool(CONFIG_NAME.search(_name(node.value) or '')) or _key(node.slice) in SECTION_KEYS
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == 'get'
              and node.args):
            hit = bool(CONFIG_NAME.search(_name(node.func.value) or '')) or _key(node.args[0]) in SECTION_KEYS
        if hit:
            found.append((scope, node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source), '')
    return found


def _allowed(path: str, scope: str) -> bool:
    return (path, '*') in ALLOWED or any((path, name) in ALLOWED for name in (scope, scope.split('.')[-1]))


def test_no_module_reads_the_plain_config_dict():
    reads = []  # the package and scripts/ (not bench/, which builds and edits the configs it measures by hand)
    for p in sorted([*(ROOT / 'mortal').rglob('*.py'), *(ROOT / 'scripts').glob('*.py')]):
        path = p.relative_to(ROOT).as_posix()
        reads += [f'{path}:{line} ({scope or "module"}): {code}' for scope, line, code in
                  config_reads(p.read_text(encoding='utf-8')) if not _allowed(path, scope)]
    assert not reads, 'read typed sections (mortal.config.typed / section) instead:\n' + '\n'.join(reads)


def test_every_allowed_place_still_reads_the_plain_dict():
    # an entry whose reason is gone must go too, so that the list stays the few places that need it
    for path, scope in ALLOWED:
        scopes = {s for s, _, _ in config_reads((ROOT / path).read_text(encoding='utf-8'))}
        assert scope == '*' or any(s == scope or s.endswith(f'.{scope}') for s in scopes), (path, scope)


def test_the_check_sees_each_way_of_reading_the_dict():
    source = '''
server_cfg = {}
def f(config, ckpt_cfg, state, cfg):
    a = config['dataset']['globs']
    b = ckpt_cfg.get('control', {}).get('online')
    c = server_cfg.get('max_frame_bytes', 5)
    d = state['dataset']
    cfg['log_dir'] = 'x'
    e = self.config['optim']
class C:
    def g(self, side, slot):
        return side.get('enable_amp', False), slot['device'], self.cfg.control.version, typed(self.config).control
def h(x, config):
    return x.get('grp', {}), lookup(config, 'a.b'), section(config, 'a.b').c
'''
    reads = [(scope, code) for scope, _, code in config_reads(source)]
    assert reads == [('f', "config['dataset']"), ('f', "ckpt_cfg.get('control', {})"),
                     ('f', "server_cfg.get('max_frame_bytes', 5)"), ('f', "state['dataset']"), ('f', "cfg['log_dir']"),
                     ('f', "self.config['optim']"), ('C.g', "side.get('enable_amp', False)"), ('C.g', "slot['device']"),
                     ('h', "x.get('grp', {})")]
    # what is not a config table: a checkpoint's guard state, the results of a run
    assert config_reads("state.get('guard', {}); timings['online']; result['test_play']; reply.get('status')") == []
    assert _allowed('mortal/model/checkpoint.py', 'arch_of') and not _allowed('mortal/model/checkpoint.py', 'other')
