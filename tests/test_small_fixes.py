"""Small operator traps of issue 35/36's hostile trial: a removed key in the wrong table, the doc generator's
encoding, the wheel script under sh."""

import logging
import os
import shutil
import subprocess
import sys

import pytest
import toml

from conftest import ROOT, tiny_config_dict
from mortal.config import load_config


def test_a_removed_key_in_the_wrong_table_says_it_was_removed(tmp_path, caplog):
    cfg = tiny_config_dict(tmp_path)
    cfg['control']['n_step'] = 3
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        load_config(path, required=('control',), env={})
    assert (f'unknown key [control] n_step in {path} ([online] n_step was removed: measured as no gain '
            f'(docs/config.md, "Removed keys"); delete the line)') in caplog.text


def test_gen_config_doc_writes_utf8_whatever_the_io_encoding(tmp_path):
    want = (ROOT / 'docs' / 'config.md').read_bytes()
    env = {**os.environ, 'PYTHONIOENCODING': 'ascii'}
    out = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'gen_config_doc.py')], capture_output=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == want
    subprocess.run([sys.executable, str(ROOT / 'scripts' / 'gen_config_doc.py'), str(tmp_path / 'c.md')],
                   check=True, env=env, timeout=120)
    assert (tmp_path / 'c.md').read_bytes() == want


@pytest.mark.skipif(shutil.which('sh') is None or shutil.which('bash') is None, reason='needs sh and bash')
def test_device_wheels_runs_under_sh(tmp_path):
    (tmp_path / 'scripts').mkdir()
    shutil.copy(ROOT / 'scripts' / 'device_wheels.sh', tmp_path / 'scripts')
    # PYTHON=false: the download step fails (status 1) after everything before it ran, offline and harmless
    out = subprocess.run(['sh', str(tmp_path / 'scripts' / 'device_wheels.sh')], capture_output=True, text=True,
                         env={**os.environ, 'PYTHON': 'false'}, timeout=60)
    assert 'pipefail' not in out.stderr and out.returncode == 1, out.stderr
    assert (tmp_path / '.whl').is_dir()
