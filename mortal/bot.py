"""Play one seat over the mjai protocol (Mortal's ``mortal/mortal.py`` and ``libriichi.mjai.Bot``).

``python -m mortal.bot <SEAT>`` loads ``[control] state_file`` on the CPU, reads one mjai event per line on stdin
and prints a reaction line (with Mortal's ``meta``) whenever the seat can act. Settings as Mortal's bot; the agari
guard has no table to price a hora and allows every one.

Review mode (``MORTAL_REVIEW_MODE=1``): quick eval off, every event without a reaction prints ``{"type":"none",
"meta":{"mask_bits":0}}``, and at EOF one line ``{"model_tag": ..., "phi_matrix": [K x 4 x 4]}`` of the GRP
(entry [k][p][r] = P(seat p finishes at rank r) after kyoku k's start)."""

if __package__ in (None, ''):  # run as a script: python mortal/bot.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import json
import logging
import os
import signal
import sys
from datetime import datetime, timezone
from typing import IO

logger = logging.getLogger('mortal.bot')  # not __name__: '__main__' under python -m

REVIEW_ENV = 'MORTAL_REVIEW_MODE'
NO_REACTION = '{"type":"none","meta":{"mask_bits":0}}'  # review mode: an event without a decision
MAX_LINE = 1 << 20  # characters of one input line (an mjai event has under 1,000): longer ones are not parsed


class BotError(RuntimeError):
    """An input event the bot cannot process; the message names the input line."""


class Bot:
    """Seat ``player_id`` (0-3, else ValueError) driven by ``engine`` (Mortal's ``libriichi.mjai.Bot``)."""

    def __init__(self, engine, player_id: int):
        from mjai.mlibriichi.state import PlayerState
        from mortal.play.agent import make_agent, needs_v4_encoder

        if isinstance(player_id, bool) or player_id not in range(4):
            raise ValueError(f'player_id must be 0-3, got {player_id!r}')
        self.player_id = player_id
        self.agent = make_agent(engine)
        self.state = PlayerState(player_id)
        # version 4: the seat's V4Encoder sees every event the state sees (it resets at start_kyoku)
        self.v4 = None
        if needs_v4_encoder(self.agent):
            from mortal.features.obs_v4 import V4Encoder
            self.v4 = V4Encoder(player_id)
        self._since_last = []  # JSON events since the previous decision (mjai-bot agents read them)
        self._game = 0
        self.events = 0  # events applied (the stop line's count)

    def react(self, line: str) -> str | None:
        """Update with one mjai event (JSON text); the reaction JSON line or None. Raises BotError for a bad line."""
        if len(line) > MAX_LINE:
            raise BotError(f'a line of {len(line):,} characters, over {MAX_LINE:,} (an mjai event is under 1,000)')
        try:
            event = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, too many digits, nested too deep
            raise BotError(f'not a JSON event ({type(exc).__name__}: {str(exc)[:200]}): {line[:200]}') from None
        if not isinstance(event, dict) or not isinstance(event.get('type'), str):
            raise BotError(f'an event must be a JSON object with a "type": {line[:200]}')
        can_act = event.pop('can_act', True) is not False
        text = json.dumps(event, separators=(',', ':'))
        try:
            cans = self.state.update(text)
            if self.v4 is not None:
                self.v4.update(event)
        except BaseException as exc:  # Rust panics derive from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise BotError(f'seat {self.player_id} cannot apply event {line[:200]}: {exc}') from None
        self.events += 1
        kind = event['type']
        if kind == 'end_game':
            self.agent.end_game(self._game, self.player_id)
            self._game += 1
            self._since_last = []
        else:
            self._since_last.append(text)
        if not can_act or not cans.can_act:
            return None

        from mortal.play.agent import Scene
        scene = Scene(game=self._game, seat=self.player_id, state=self.state, events=self._since_last, v4=self.v4)
        self._since_last = []
        decision = self.agent.react([scene])[0]
        out = dict(decision.reaction)
        if decision.meta is not None:
            out['meta'] = decision.meta
        return json.dumps(out, separators=(',', ':'))


def model_tag(state: dict, version: int, num_blocks: int, conv_channels: int) -> str:
    """``state['tag']`` if the checkpoint has one, else ``mortal{v}-b{blocks}c{channels}-t{yymmddHH UTC}``."""
    if 'tag' in state:
        return str(state['tag'])
    time = datetime.fromtimestamp(state['timestamp'], tz=timezone.utc).strftime('%y%m%d%H')
    return f'mortal{version}-b{num_blocks}c{conv_channels}-t{time}'


def load_engine(state_file: str, *, review_mode: bool):
    """``(MortalEngine, tag)`` from a checkpoint with the bot's settings (CPU). Raises CheckpointError."""
    from mortal.model.checkpoint import arch_of, load_checkpoint, load_errors, models_from_state
    from mortal.play.engine import MortalEngine

    with load_errors('[control] state_file', state_file):
        state = load_checkpoint(state_file)
        brain, dqn, version = models_from_state(state, state_file)
        arch = arch_of(state, state_file)  # of the checkpoint's own config
        tag = model_tag(state, version, arch['num_blocks'], arch['conv_channels'])
    logger.info('loaded %s: version %d, %d blocks x %d channels, tag %s, steps %s', os.path.abspath(state_file),
                version, arch['num_blocks'], arch['conv_channels'], tag, state.get('steps', '?'))
    engine = MortalEngine(brain, dqn, version=version, enable_quick_eval=not review_mode,
                          enable_rule_based_agari_guard=True, name='mortal')
    return engine, tag


def load_review_grp(config: dict):
    """The GRP of ``[grp] state_file`` in eval mode on the CPU. Raises CheckpointError."""
    from mortal.config import typed
    from mortal.model.checkpoint import load_errors
    from mortal.data.reward import load_grp

    grp = typed(config).grp
    with load_errors('[grp] state_file', grp.state_file):
        return load_grp(grp.state_file, grp.network)


def phi_matrix(grp, log_lines: list[str]) -> list:
    """``grp``'s rank-probability matrices ``(K, 4, 4)`` (nested lists) for every kyoku prefix of ``log_lines``.
    Raises BadLogError (no finished kyoku)."""
    import torch
    from mortal.data.grp import Grp

    feature = Grp.load_log('\n'.join(log_lines), '<stdin>').take_feature()
    seq = [torch.as_tensor(feature[:i + 1]) for i in range(len(feature))]
    with torch.inference_mode():
        matrix = grp.calc_matrix(grp(seq))
    return matrix.tolist()


def serve(bot: Bot, stdin: IO[str], stdout: IO[str], *, review_mode: bool = False) -> list[str]:
    """The stdin/stdout loop; returns the input lines. Raises BotError naming a bad line's 1-based number."""
    lines = []
    # stripped, non-empty lines (Mortal's common.filtered_trimmed_lines)
    for n, line in enumerate(filter(None, map(str.strip, stdin)), 1):
        lines.append(line)
        try:
            reaction = bot.react(line)
        except BotError as exc:
            raise BotError(f'input line {n}: {exc}') from None
        if reaction is not None:
            print(reaction, file=stdout, flush=True)
        elif review_mode:
            print(NO_REACTION, file=stdout, flush=True)
    return lines


USAGE = 'python -m mortal.bot [-c/--config PATH] <SEAT>   (SEAT: the player ID, an integer within [0, 3])'


def main(argv: list[str] | None = None, *, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> int:
    """``python -m mortal.bot <SEAT>``; returns the exit status (2 usage/config/checkpoint error, 1 bad input)."""
    from mortal import entry
    from mortal.model.checkpoint import CheckpointError
    from mortal.config import BOT_SECTIONS, ConfigError, typed

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    parser = entry.parser('Play one seat over mjai on stdin/stdout.', prog='python -m mortal.bot', usage=USAGE)
    parser.add_argument('seat', type=int, choices=range(4), metavar='SEAT')
    # WARNING: stdout is the protocol channel, the log (stderr) carries problems, and the bot's own lines (what it
    # loaded, why it stopped)
    args = entry.start(parser, argv, log_level=logging.WARNING)
    logger.setLevel(logging.INFO)
    review_mode = os.environ.get(REVIEW_ENV, '0') == '1'
    required = BOT_SECTIONS + (('grp', 'grp.network') if review_mode else ())
    try:
        config = entry.load_config(args, required)
    except ConfigError as exc:
        return entry.error(exc)
    try:
        engine, tag = load_engine(typed(config).control.state_file, review_mode=review_mode)
        grp = load_review_grp(config) if review_mode else None  # fail before the game, not after it
    except CheckpointError as exc:
        return entry.error(exc)
    bot = Bot(engine, args.seat)
    previous = entry.stop_on_sigterm()
    try:
        lines = serve(bot, stdin, stdout, review_mode=review_mode)
        logger.info('input ended after %d events (%d games): stopped', bot.events, bot._game)
        if review_mode:
            from mortal.data.mjai_log import BadLogError
            try:
                matrix = phi_matrix(grp, lines)
            except BadLogError as exc:
                return entry.error(f'cannot review this log: {exc}', 1)
            print(json.dumps({'model_tag': tag, 'phi_matrix': matrix}), file=stdout, flush=True)
    except BotError as exc:
        return entry.error(exc, 1)
    except KeyboardInterrupt as exc:  # also SIGTERM (entry.stop_on_sigterm)
        logger.info('stopped on %s after %d events (%d games); nothing is kept', entry.stop_cause(exc), bot.events,
                    bot._game)
        return entry.stop_status(exc)
    except BrokenPipeError:
        return _reader_gone(stdout)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


SIGPIPE_STATUS = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`


def _reader_gone(stdout: IO[str]) -> int:
    """stdout's reader went away: exit quietly; stdout to devnull so the exit flush raises nothing (Python's idiom)."""
    if stdout is sys.stdout:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no real descriptor (e.g. replaced by a test)
            pass
    return SIGPIPE_STATUS


if __name__ == '__main__':
    sys.exit(main())
