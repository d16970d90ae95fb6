"""Which mortal/ modules run between the server receiving a client's log and the learner's optimizer step for it.

One online round in this process, on a tiny CPU model: a ``ParamServer`` over a ``ReplayStore`` serves from a
thread; a learner (``mortal.train.Trainer``, fake test player and writer) submits its idle parameters; then,
profiled, a client's ``submit_replay`` of one real log (``tests/data/riichienv_selfplay_hanchan.jsonl``, its seat 0
renamed ``trainee``) and the learner's ``train_epoch`` up to its first ``optimizer.step()``.

Counting rule: a module counts when a function defined in it (module-level code excluded, so lazy imports do not
count) is called, in any thread, after the server's handler starts reading the submit_replay frame and before the
optimizer step; the learner's construction and config loading happen before and do not count; loader workers are
off (``[dataset] num_workers`` 0), so the loader runs in this process; code run by an import (module and class
bodies, and what they call) does not count. Prints one module per line, then the count.

    python bench/log_to_step.py [--tree DIR]
"""

import argparse
import inspect
import os
import pathlib
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Done(Exception):
    """Raised by the wrapped optimizer step: the path ends there."""


def measure(tree: pathlib.Path) -> list:
    sys.path[:0] = [str(tree), str(tree / 'tests')]
    import conftest
    from mortal.net import wire
    from mortal.net.param_server import ParamServer
    from mortal.net.replay_store import ReplayStore

    tmp = pathlib.Path(tempfile.mkdtemp(prefix='log_to_step-'))
    config, _ = conftest.load_tiny_config(tmp, online=True, **{'control': {'test_every': 1000, 'save_every': 1000,
                                                                             'submit_every': 1000}})
    conftest.write_baseline(config, config['baseline']['train']['state_file'])
    conftest.write_grp(config)
    srv = config['online']['server']
    store = ReplayStore(srv['buffer_dir'], srv['drain_dir'], srv['capacity'])
    store.reset_dirs()
    server = ParamServer(('127.0.0.1', 0), store, timeout=10)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    remote = wire.Remote('127.0.0.1', server.server_address[1], timeout=10)
    trainer = conftest.fake_trainer(config, remote=remote)
    trainer.submit_param(is_idle=True)
    sid = remote.request({'type': 'get_param', 'param_version': -1})['server_id']
    text = (ROOT / 'tests' / 'data' / 'riichienv_selfplay_hanchan.jsonl').read_bytes()
    log = text.replace(b'"names":["0",', b'"names":["trainee",', 1)

    step = trainer.optimizer.step

    def last_step(*args, **kwargs):
        step(*args, **kwargs)
        raise Done

    trainer.optimizer.step = last_step
    files = {}
    mortal_dir = str(tree / 'mortal') + os.sep
    on = threading.Event()

    here = sys._getframe()  # the learner's calls run under this frame, the server's in threads of their own

    def profile(frame, event, arg):
        code = frame.f_code
        if event != 'call' or not on.is_set() or not code.co_filename.startswith(mortal_dir):
            return
        if not code.co_flags & inspect.CO_OPTIMIZED:
            return  # a module or class body
        up = frame.f_back
        while up is not None and up is not here:  # run by an import (a decorator, a table built at import time)
            if up.f_code.co_name == '<module>':
                return
            up = up.f_back
        files.setdefault(os.path.relpath(code.co_filename, tree), set()).add(code.co_qualname)

    on.set()
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        remote.request({'type': 'submit_replay', 'logs': {'0.json': log}, 'param_version': 1, 'server_id': sid})
        trainer.train_epoch()
    except Done:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        on.clear()
        server.shutdown()
        server.server_close()
    return sorted(files.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tree', type=pathlib.Path, default=ROOT, help='the checkout to measure (default: this one)')
    parser.add_argument('--why', action='store_true', help='name the functions called in each module')
    args = parser.parse_args(argv)
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    modules = measure(args.tree.resolve())
    for m, functions in modules:
        print(f'{m}  {", ".join(sorted(functions))}' if args.why else m)
    print(f'{len(modules)} modules')
    return 0


if __name__ == '__main__':
    sys.exit(main())
