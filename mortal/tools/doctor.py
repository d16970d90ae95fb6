"""Pre-flight checks of a config before a long run: ``python -m mortal.tools.doctor [-c config.toml]``."""

if __package__ in (None, ''):  # run as a script: python mortal/tools/doctor.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import copy
import dataclasses
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

from mortal.config import lookup, profile_table, put, typed

OK, FAIL, WARN, INFO = 'OK', 'FAIL', 'WARN', 'INFO'

# A CUDA context plus cuBLAS/cuDNN workspaces, measured as ~0.3-0.6 GiB on recent GPUs.
CUDA_CONTEXT_BYTES = 512 * 2**20
# Caching-allocator fragmentation and temporaries on top of what the estimate counts.
ALLOCATOR_SLACK = 1.25
# cuDNN benchmark workspaces as a multiple of the saved activations, by AMP (fitted: docs/operations.md).
CUDNN_BENCHMARK_FACTOR = {True: 1.85, False: 7.57}
GIB = 2**30


@dataclasses.dataclass
class Check:
    """One checklist row: ``status`` in OK/FAIL/WARN/INFO, ``name`` a short topic, ``detail`` text."""
    status: str
    name: str
    detail: str

    def line(self):
        return f'[{self.status:^4}] {self.name}: {self.detail}'


def _written_paths(config):
    """(label, path, 'dir' or 'file') of everything the processes create."""
    cfg = typed(config)
    server = cfg.online.server if cfg.online is not None else None
    rows = [
        ('[control] state_file', cfg.control.state_file, 'file'),
        ('[control] best_state_file', cfg.control.best_state_file, 'file'),
        ('[control] tensorboard_dir', cfg.control.tensorboard_dir, 'dir'),
        ('[test_play] log_dir', cfg.test_play and cfg.test_play.log_dir, 'dir'),
        ('[online.server] buffer_dir', server and server.buffer_dir, 'dir'),
        ('[online.server] drain_dir', server and server.drain_dir, 'dir'),
        ('[1v3] log_dir', cfg.one_vs_three and cfg.one_vs_three.log_dir, 'dir'),
        ('[grp] state_file', cfg.grp and cfg.grp.state_file, 'file'),
    ]
    for profile, table in (cfg.train_play or {}).items():
        rows.append((f'[{profile_table(profile)}] log_dir', table.log_dir, 'dir'))
    return [(label, path, kind) for label, path, kind in rows if path]


def probe_writable(path, kind):
    """None when ``path`` ('dir' or 'file') can be written, else why (one temp file probed, nothing left)."""
    p = Path(path).expanduser()
    if p.exists():
        if kind == 'dir' and not p.is_dir():
            return f'{p} exists and is not a directory'
        if kind == 'file' and p.is_dir():
            return f'{p} is a directory, expected a file'
    probe_dir = p if (kind == 'dir' and p.is_dir()) else p.parent
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        return f'{probe_dir} is a file, not a directory'
    try:
        fd, tmp = tempfile.mkstemp(dir=probe_dir, prefix='.doctor-')
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return f'cannot write in {probe_dir}: {e.strerror or e}'
    return None


def check_paths(config):
    return [Check(FAIL, 'writable', f'{label} = {path}: {reason}') if (reason := probe_writable(path, kind))
            else Check(OK, 'writable', f'{label} = {path}') for label, path, kind in _written_paths(config)]


def check_port(config, server_running=False):
    """Server port: free to bind (default) or, with ``server_running``, accepting connections."""
    remote = typed(config).online.remote  # an online config has one (mortal.config.CLIENT_SECTIONS)
    host, port = remote.host, remote.port  # the server binds [online.remote] host
    if port == 0:  # the tests' setting: the OS picks a port that no client or learner can know
        return [Check(WARN, 'port', f'[online.remote] port = 0: the server binds a port the system picks, which '
                      'the client and the learner, reading the same key, cannot find; name a port for a run')]
    if server_running:
        try:
            with socket.create_connection((host, port), timeout=3):
                return [Check(OK, 'port', f'a server answers on {host}:{port}')]
        except OSError as e:
            return [Check(FAIL, 'port', f'nothing answers on {host}:{port} ({e}); is the server up?')]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # same option the server would use, so TIME_WAIT leftovers do not count as busy
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return [Check(FAIL, 'port', f'cannot bind {host}:{port} ({e.strerror or e}); another '
                          'server running? (use --server-running to check a running one instead)')]
    return [Check(OK, 'port', f'{host}:{port} is free')]


def load_mortal_checkpoint(path, config):
    """Problems of a trainer checkpoint against ``[resnet]`` and ``[control] version``; [] if fine."""
    from mortal.model.checkpoint import CheckpointError, describe_error, describe_mismatches, load_checkpoint
    from mortal.model.networks import DQN, Brain
    cfg = typed(config)
    version, resnet = cfg.control.version, cfg.resnet  # [resnet] is one of mortal.config.CORE_SECTIONS
    try:
        state = load_checkpoint(path)
    except (OSError, CheckpointError) as e:  # OSError: vanished or unreadable since it was seen
        return [f'cannot load: {describe_error(e)}']
    if not isinstance(state, dict) or 'mortal' not in state or 'current_dqn' not in state:
        keys = sorted(state)[:8] if isinstance(state, dict) else type(state).__name__
        return [f"not a Mortal checkpoint: needs keys 'mortal' and 'current_dqn', has {keys}"]
    problems = []
    saved = state.get('config') if isinstance(state.get('config'), dict) else {}  # the checkpoint's plain dict
    for dotted, want in (('resnet.conv_channels', resnet.conv_channels), ('resnet.num_blocks', resnet.num_blocks),
                         ('control.version', version)):
        have = lookup(saved, dotted)
        if have is not None and have != want:
            table, key = dotted.split('.')
            problems.append(f'saved [{table}] {key} = {have}, config has {want}')
    if problems:
        return problems
    try:
        brain = Brain(conv_channels=resnet.conv_channels, num_blocks=resnet.num_blocks, version=version)
        dqn = DQN(version=version)
    except (ValueError, TypeError) as e:
        return [f'cannot build Brain/DQN from [resnet]/version: {e}']
    for name, module in (('mortal', brain), ('current_dqn', dqn)):
        problems += [f'{name}: {p}' for p in describe_mismatches(module.state_dict(), state[name])]
    return [f'weights do not fit [resnet]/version: {"; ".join(problems)}'] if problems else []


def check_checkpoints(config):
    """A row per checkpoint the processes read: ``[control] state_file``, and the baselines (required online)."""
    cfg = typed(config)
    baseline = cfg.baseline
    files = [('[control] state_file', cfg.control.state_file, False)]
    files += [(f'[baseline.{sec}] state_file', getattr(baseline, sec).state_file, cfg.control.online)
              for sec in ('train', 'test') if baseline is not None and getattr(baseline, sec) is not None]
    train = baseline.train if baseline is not None else None
    fetched = train.state_file if train is not None and train.from_server else None  # a client fetches it
    rows = []
    for label, path, required in [row for row in files if row[1]]:
        if Path(path).is_file():
            problems = load_mortal_checkpoint(path, config)
            rows.append(Check(FAIL, 'checkpoint', f'{label} = {path}: {"; ".join(problems)}') if problems
                        else Check(OK, 'checkpoint', f'{label} = {path} loads and matches [resnet]/version'))
        elif required and path == fetched:
            # a client machine needs no such file; the trainer's machine does ([baseline.test]: test play)
            rows.append(Check(INFO if label.startswith('[baseline.train]') else WARN, 'checkpoint',
                              f"{label} = {path}: missing; fine on a client machine (a client fetches the "
                              "trainer's baseline into it: [baseline.train] from_server), the trainer needs it"))
        elif required:
            rows.append(Check(FAIL, 'checkpoint', f'{label} = {path}: missing (needed by the online client/test play)'))
        else:
            rows.append(Check(INFO, 'checkpoint', f'{label} = {path}: absent: training starts from freshly '
                              'initialised weights'))
    return rows


def check_grp(config):
    """GRP checkpoint (``[grp] state_file``, key ``model``) loads into ``GRP(**[grp.network])``."""
    from mortal.model.checkpoint import describe_error, describe_mismatches, load_checkpoint
    from mortal.model.networks import GRP
    grp = typed(config).grp
    path = grp.state_file if grp is not None else None
    if not path:
        return [Check(FAIL, 'grp', '[grp] state_file is not set')]
    if not Path(path).is_file():
        return [Check(FAIL, 'grp', f'[grp] state_file = {path}: missing (train it with mortal.train_grp)')]
    network = grp.network.model_dump() if grp.network is not None else {}  # GRP's keyword arguments
    try:
        state = load_checkpoint(path)
        saved = state['model'] if isinstance(state, dict) and 'model' in state else None
        problems = (describe_mismatches(GRP(**network).state_dict(), saved) if saved is not None
                    else ["not a GRP checkpoint: needs key 'model'"])
    except Exception as e:  # a bad file (CheckpointError), one vanished meanwhile, a [grp.network] GRP rejects
        problems = [f'cannot load: {describe_error(e)}']
    if problems:
        return [Check(FAIL, 'grp', f'[grp] state_file = {path} does not fit GRP({network}): '
                      + '; '.join(problems))]
    return [Check(OK, 'grp', f'[grp] state_file = {path} loads into GRP({network})')]


def _model_parts(conv_channels, num_blocks, version, device='meta'):
    from mortal.model.networks import DQN, AuxNet, Brain

    import torch
    with torch.device(device):
        return (Brain(conv_channels=conv_channels, num_blocks=num_blocks, version=version),
                DQN(version=version), AuxNet(dims=(4,)))


def _param_bytes(*modules):
    return sum(t.numel() * t.element_size() for m in modules for t in (*m.parameters(), *m.buffers()))


def _weight_count(*modules):
    """Elements of the convolution and linear weights (what autocast keeps a 2-byte copy of)."""
    from torch import nn
    return sum(m.weight.numel() for mod in modules for m in mod.modules() if isinstance(m, (nn.Conv1d, nn.Linear)))


def saved_bytes(conv_channels, num_blocks, version, batch, *, amp=False, weights=0, step=False):
    """Bytes autograd keeps for backward in one training forward at ``batch`` rows (versions 2-4; ``step``:
    the peak at the start of backward); docs/operations.md, "The doctor's memory estimate"."""
    from mortal.features.obs import obs_shape
    c, width = conv_channels, 2 if amp else 4
    per_row = width * (34 * (obs_shape(version)[0] + (7 * num_blocks + 3) * c + 64)
                       + num_blocks * (3 * c + 4 * (c // 16)) + 2 * 1024 + 4 * {2: 512, 3: 256}.get(version, 0))
    per_row += 2 * 46 + 8
    if step:
        per_row += (34 * obs_shape(version)[0] * 4 if amp else 0) + 2 * 34 * c * width
    return batch * per_row + (8 * num_blocks + 4) * c * 4 + (2 * weights if amp else 0)


def inference_bytes_per_sample(conv_channels, version):
    """Peak live float32 bytes per row of an inference forward."""
    from mortal.features.obs import obs_shape
    return 4 * (34 * (obs_shape(version)[0] + 3 * conv_channels) + 2 * conv_channels + 1024 + 46)


def estimate_memory(config, profile='default'):
    """``{process name: (device, bytes)}`` of the trainer and the client (docs/operations.md, "The doctor's
    memory estimate"); ``config`` is read untyped, a what-if also outside the schema's ranges."""
    version = lookup(config, 'control.version')
    cc = lookup(config, 'resnet.conv_channels')
    nb = lookup(config, 'resnet.num_blocks')
    amp = bool(lookup(config, 'control.enable_amp'))
    brain, dqn, aux = _model_parts(cc, nb, version)
    model = _param_bytes(brain, dqn)
    train_static = _param_bytes(brain, dqn, aux) * 4  # weights + grads + 2 AdamW moments
    infer = inference_bytes_per_sample(cc, version)

    batch = lookup(config, 'control.batch_size')
    test_games = lookup(config, 'test_play.games', 0)
    train_games = lookup(config, f'{profile_table(profile)}.games', 0)
    trainer_dev = lookup(config, 'control.device')
    workspace = 0
    if str(trainer_dev).startswith('cuda') and lookup(config, 'control.enable_cudnn_benchmark', False):
        workspace = CUDNN_BENCHMARK_FACTOR[amp] * saved_bytes(cc, nb, version, batch, amp=amp)

    def total(device, body, extra=0):
        ctx = CUDA_CONTEXT_BYTES if str(device).startswith('cuda') else 0
        return device, int(ctx + body * ALLOCATOR_SLACK + extra)

    train_peak = train_static + saved_bytes(cc, nb, version, batch, amp=amp, weights=_weight_count(brain, dqn, aux),
                                            step=True)
    test_peak = train_static + model + 3 * test_games * infer
    client_dev = lookup(config, 'baseline.train.device', trainer_dev)
    client = 2 * model + 3 * train_games * infer
    trainer = total(trainer_dev, train_peak, workspace) if train_peak + workspace > test_peak else \
        total(trainer_dev, test_peak)
    return {'trainer': trainer, 'client': total(client_dev, client)}


def _gpu_total_bytes(device):
    import torch
    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index or 0
    return torch.cuda.get_device_properties(index).total_memory


def check_memory(config, profile='default'):
    try:
        est = estimate_memory(config, profile)
        lean_config = copy.deepcopy(config)
        put(lean_config, 'control.enable_cudnn_benchmark', False)
        lean = estimate_memory(lean_config, profile)
    except Exception as e:  # a broken [resnet] is reported by the checkpoint checks too
        return [Check(FAIL, 'memory', f'cannot build the model from [resnet]/version: {e}')]
    rows = []
    for name, (device, nbytes) in est.items():
        text = f'{name} on {device} ~ {nbytes / GIB:.2f} GiB (estimate)'
        if not str(device).startswith('cuda'):
            rows.append(Check(INFO, 'memory', f'{text} of tensors; the Python + torch process itself adds ~0.5-1 GiB '
                                              'of RAM'))
        elif (gpu := _gpu_total_bytes(device)) is None:  # a FAIL row of check_devices names the key and the fixes
            rows.append(Check(INFO, 'memory', f'{text}; but no CUDA device is visible to torch'))
        elif nbytes > gpu >= lean[name][1]:  # the benchmark takes what is free: a smaller card gives it less
            rows.append(Check(WARN, 'memory', f'{text} exceeds {device} total {gpu / GIB:.1f} GiB with the '
                              f'cuDNN benchmark\'s workspaces (fitted on an H200), {lean[name][1] / GIB:.2f} GiB '
                              'without'))
        elif nbytes > gpu:
            rows.append(Check(FAIL, 'memory', f'{text} exceeds {device} total {gpu / GIB:.1f} GiB; '
                              'lower [control] batch_size or the play games'))
        else:
            rows.append(Check(INFO, 'memory', f'{text} of {gpu / GIB:.1f} GiB'))
    return rows


def check_file_indexes(config):
    """FAIL rows for a cached file index that is none or lists missing or foreign files; WARN for other globs."""
    from mortal.data.offline_data import index_problems, stale_index
    from mortal.model.checkpoint import describe_error, load_checkpoint
    cfg = typed(config)
    grp_ds = cfg.grp.dataset if cfg.grp is not None else None
    tables = []
    if cfg.dataset is not None:
        tables.append(('[dataset]', cfg.dataset.file_index, {'file_list': cfg.dataset.globs},
                       {'globs': cfg.dataset.globs}))
    if grp_ds is not None:
        tables.append(('[grp.dataset]', grp_ds.file_index,
                       {'train_file_list': grp_ds.train_globs, 'val_file_list': grp_ds.val_globs},
                       {'train_globs': grp_ds.train_globs, 'val_globs': grp_ds.val_globs}))
    rows = []
    for table, file_index, lists, globs in tables:
        if not file_index or not Path(file_index).is_file():
            continue
        where = f'{table} file_index = {file_index}'
        try:
            index = load_checkpoint(file_index)
            if not isinstance(index, dict) or not all(isinstance(index.get(k), (list, tuple)) for k in lists):
                raise ValueError(f'needs the lists {sorted(lists)}')
        except Exception as e:  # garbage, another format
            rows.append(Check(FAIL, 'file index', f'{where}: not a file index ({describe_error(e)}); delete it'))
            continue
        if (stale := stale_index(index, globs)) is not None:
            rows.append(Check(WARN, 'file index', f'{where}: {stale}: the next run rebuilds it'))
        elif problems := index_problems(index, lists):
            rows.append(Check(FAIL, 'file index', f'{where}: {"; ".join(problems)}; delete it to rebuild it'))
        else:
            rows.append(Check(OK, 'file index', f'{where}: every listed file is there, within the globs'))
    return rows


def check_devices(config):
    """A FAIL row per unusable CUDA device key (``entry.device_problems``)."""
    from mortal import entry
    keys = dict.fromkeys(entry.TRAIN_DEVICES + entry.CLIENT_DEVICES + entry.GRP_DEVICES + entry.ONE_VS_THREE_DEVICES)
    return [Check(FAIL, 'device', line) for line in entry.device_problems(config, keys)]


def run_checks(config, *, server_running=False, profile='default'):
    """All checks for an already loaded config dict; returns the list of ``Check``."""
    from mortal.features.obs import UnsupportedVersionError, check_version
    rows = []
    try:
        version = check_version(typed(config).control.version)
        rows.append(Check(OK, 'version', f"[control] version = {version}"))
    except UnsupportedVersionError as e:
        return rows + [Check(FAIL, 'version', str(e))]
    if version == 4:
        from mortal.features.obs_v4 import sp_threads
        from mortal.features.sp import calc
        if not calc.HAVE_CORE:
            rows.append(Check(FAIL, 'version', calc.CORE_MISSING))
        rows.append(Check(INFO, 'version', 'version 4 observations (1012 x 34) run a single-player search per '
                                           'decision in self-play and per sample in the loader; slower than v3 '
                                           f'({sp_threads()} search threads per process: MORTAL_SP_THREADS)'))
    rows += check_devices(config)
    rows += check_paths(config)
    if typed(config).control.online:
        rows += check_port(config, server_running)
    rows += check_checkpoints(config)
    rows += check_grp(config)
    rows += check_file_indexes(config)
    rows += check_memory(config, profile)
    return rows


def typo_checks(config: dict, path: str) -> tuple[list[Check], set[str]]:
    """A FAIL row per unknown key close to a known one, and the ``validate`` warnings those rows replace."""
    from mortal import config as mcfg
    from mortal import config_keys
    rows, replaced, absent = [], set(), object()
    for u in mcfg.unknown_names(config):
        if u.suggestion:
            given = mcfg.lookup(config, f'{u.table}.{u.suggestion}', absent)  # the file's own value, if any
            default = config_keys.section_keys(u.table)[u.suggestion].default
            if given is not absent:
                used = f'use {u.suggestion} = {given!r}'
            elif default is config_keys.UNFILLED:
                used = f'leave {u.suggestion} unset'
            elif default is config_keys.REQUIRED:
                used = f'find no {u.suggestion} (a required key)'
            else:
                used = f'use {u.suggestion} = {default!r}'
            rows.append(Check(FAIL, 'config', f'[{u.table}] {u.name} is not a key: did you mean {u.suggestion!r}? '
                                              f'As written, the processes ignore it and {used}'))
            replaced.add(mcfg.unknown_warning(u, path))
    return rows, replaced


def main(argv=None):
    """``python -m mortal.tools.doctor [-c PATH] [--server-running] [--profile NAME]``; 1 when a check FAILs."""
    from mortal import config as mcfg
    from mortal import config_paths, entry
    parser = entry.parser('Check a config before a long run.')
    parser.add_argument('--server-running', action='store_true',
                        help='expect a running server on [online.remote] instead of a free port')
    parser.add_argument('--profile', default=None,
                        help='train_play profile for the client estimate (default: $TRAIN_PLAY_PROFILE or default)')
    args = entry.start(parser, argv, log_level=None)  # the checklist on stdout is the output

    env = args.overrides
    if args.profile:
        env = dataclasses.replace(env, profile=args.profile, profile_source='--profile')
    path = mcfg.resolve_path(args.config, env)
    profile = env.profile
    config_log = logging.getLogger('mortal.config')
    level = config_log.level
    config_log.setLevel(logging.ERROR)  # its warnings become WARN rows below
    try:
        # one pass of the processes' own validator (mortal.config.config_errors): every problem at once
        config = mcfg.read_config(path, env)
        warns = mcfg.validate(config, path, required=mcfg.mode_sections, env=env)
        # the checks below see the paths the processes use (mortal.config.load_config expands them the same way)
        config_paths.expand_config_dir(config, config_paths.config_folder(path))
    except mcfg.ConfigError as e:
        print(Check(FAIL, 'config', str(e)).line())
        return 1
    finally:
        config_log.setLevel(level)  # main() may run again in this process (tests)
    typos, replaced = typo_checks(config, path)
    if not typos:  # a typo is a FAIL row of this same check: not OK as well
        print(Check(OK, 'config', f'{path} parses and validates').line())
    for w in warns:
        if w not in replaced:  # those are FAIL rows below
            print(Check(WARN, 'config', w).line())
    rows = typos + run_checks(config, server_running=args.server_running, profile=profile)
    for row in rows:
        print(row.line())
    failed = sum(r.status == FAIL for r in rows)
    print(f'{failed} check(s) failed' if failed else 'all checks passed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
