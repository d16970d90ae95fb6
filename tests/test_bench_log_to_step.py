"""bench/log_to_step.py: the modules between a server's submit_replay and the learner's optimizer step."""

from conftest import load_script


def test_the_path_runs_the_server_the_loader_and_the_step_and_no_config_validation(capsys):
    # 27 modules on the session's start; 25 since the loader takes the learner's typed config as it is and the save
    # cycle's helpers are train.py's
    bench = load_script('bench/log_to_step.py', 'log_to_step')
    assert bench.main([]) == 0
    *modules, count = capsys.readouterr().out.splitlines()
    assert count == f'{len(modules)} modules' and modules == sorted(modules) and len(modules) <= 25
    for module in ('net/param_server.py', 'net/replay_store.py', 'learning/server_traffic.py', 'data/claims.py',
                   'data/dataloader.py', 'data/gameplay.py', 'train.py', 'learning/loss.py', 'learning/optimizer.py'):
        assert f'mortal/{module}' in modules
    # the learner's loader takes the typed config the learner validated at its start: no validation per epoch
    assert 'mortal/config_schema.py' not in modules and 'mortal/config.py' not in modules
    assert 'mortal/client.py' not in modules  # the path starts at the server
