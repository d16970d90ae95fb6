"""The ``memory`` part of ``bench/gpu.py``: the peaks the self-play and trainer parts measured
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``) next to ``mortal.tools.doctor.estimate_memory`` for the
same config, term by term."""

import copy

from bench.gpu_common import write_config


def part_memory(ctx, results):
    """Measured peaks next to ``mortal.tools.doctor.estimate_memory`` of the same configs."""
    import toml
    from mortal.tools.doctor import estimate_memory

    sizes = ctx['sizes']
    trainer = results.get('trainer') or {}
    cfg_path = ctx['shared'].get('trainer_config') or str(write_config(
        ctx['work'] / 'memory', sizes=sizes, device=ctx['device'], version=sizes['trainer_version'],
        games=sizes['games'][sizes['trainer_version']], trainer=True))
    base = toml.load(cfg_path)

    def measured(rec):
        return (rec or {}).get('peak_memory') or {'allocated': None, 'reserved': None}

    rows = {}
    for amp in (False, True):
        key = f"amp_{'on' if amp else 'off'}"
        cfg = copy.deepcopy(base)
        cfg['control']['enable_amp'] = amp
        cfg['test_play']['games'] = 0  # the doctor's trainer figure is then its training term
        est = estimate_memory(cfg)['trainer'][1]
        steady = (trainer.get(key) or {}).get('peak_memory_steady') or {}
        rows[f'trainer_{key}'] = {**measured(trainer.get(key)), 'doctor_estimate': est,
                                  'steady_allocated': steady.get('allocated'), 'steady_reserved': steady.get('reserved'),
                                  'doctor_term': 'trainer, [test_play] games = 0 (its training term)'}
    cfg = copy.deepcopy(base)
    cfg['control']['batch_size'] = 0  # the doctor's trainer figure is then its test-play term
    rows['test_play'] = {**measured(trainer.get('test_play')), 'doctor_estimate': estimate_memory(cfg)['trainer'][1],
                         'doctor_term': f"trainer, batch_size = 0 (its test-play term, {sizes['test_games']} games)"}
    sp = results.get('selfplay_sweep') or {}
    for version in (3, 4):  # one client of the sweep's first count (1 client on the card)
        first = next(iter((sp.get(f'v{version}') or {}).values()), None) or {}
        recs = first.get('per_client') or [None]
        cfg = copy.deepcopy(base)
        cfg['control']['version'] = version
        cfg['train_play']['default']['games'] = sizes['games'][version]
        rows[f'client_v{version}'] = {**measured(recs[0]), 'doctor_estimate': estimate_memory(cfg)['client'][1],
                                      'doctor_term': f"client, {sizes['games'][version]} games per round"}
    from mortal.tools.doctor import CUDA_CONTEXT_BYTES
    for row in rows.values():  # the doctor's figure includes a CUDA context; torch's counters do not
        if row.get('reserved'):
            row['doctor_over_measured'] = round(row['doctor_estimate'] / (row['reserved'] + CUDA_CONTEXT_BYTES), 3)
    full = estimate_memory(base)
    out = {'rows': rows, 'doctor_trainer': full['trainer'][1], 'doctor_client': full['client'][1],
           'doctor_three_processes': full['trainer'][1] + full['client'][1],
           'note': 'measured: torch.cuda.max_memory_allocated / max_memory_reserved (no CUDA context); doctor: '
                   'mortal.tools.doctor.estimate_memory, which adds a 512 MiB CUDA context, 25% slack and (cuDNN '
                   'benchmark on) its fitted workspace term; null on CPU'}
    import torch
    if ctx['device'].startswith('cuda'):
        out['device_total'] = int(torch.cuda.get_device_properties(0).total_memory)
    else:
        out['device_total'] = None
    return out

