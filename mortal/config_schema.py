"""The schema of the TOML configuration: one pydantic model per ``[section]``, each key a field with its meaning, type
and range (``Annotated``); an extra's meaning starts with "extra:". Types are strict, as TOML's: an integer refuses
``8.0`` and ``true``, a number widens an integer and refuses ``inf``/``nan``. Unknown keys pass through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import AfterValidator, AllowInfNan, BaseModel, ConfigDict, Discriminator, Field, Strict, Tag

#: Feature/model versions of ``[control] version`` (Mortal's 1-3, plus 4 with the single-player block).
SUPPORTED_VERSIONS = (1, 2, 3, 4)
# [online.server] max_frame_bytes: holds a 192x40 model's parameters (~40 MB) or thousands of gz logs, with a margin
DEFAULT_MAX_FRAME_BYTES = 512 * 1024 * 1024
# [online.server] max_pending_connections and payload_min_bytes_per_s, also ParamServer's defaults
DEFAULT_MAX_PENDING = 64  # unauthenticated connections at once
DEFAULT_PAYLOAD_MIN_RATE = 128 * 1024  # bytes/s a payload must keep
# [dataset] max_log_bytes (also the readers' default, mortal.data.mjai_log): a hanchan is well under 1 MB of mjai JSON.
DEFAULT_MAX_LOG_BYTES = 64 * 1024 * 1024
SCHEDULER_DEFAULT_INIT = 1e-8  # Mortal's LinearWarmUpCosineAnnealingLR default for [optim.scheduler] init
BEST_RULES = ('paired', 'sprt', 'mortal')  # [test_play] best_rule (mortal.learning.gate)
BOOTSTRAP_FLAWS = ('', 'overcall', 'no-riichi', 'no-fold')  # [bootstrap] flaw (mortal.play.flaws.FLAWS)
REWARDS = ('grp', 'points')  # [env] reward (mortal.data.reward.REWARDS)
MAX_CONV_CHANNELS, MAX_BLOCKS = 4096, 1024  # [resnet]: far past Mortal's 192 x 40
MIN_CONV_CHANNELS = 16  # channel attention squeezes by 16 (mortal.model.networks.ChannelAttention)
MAX_OFFLINE_BATCH = 1 << 16  # rows; ~8 GB of version-3 observations, far past any sane mix


# ------------------------------------------------------------------------------------------------------------------
# Value types

@dataclass(frozen=True)
class Kind:
    """A field's TOML type in messages and docs/config.md: 'int', 'float', 'bool', 'str', 'str_list', 'float_list'."""

    name: str


def _rule(ok: Callable[[Any], bool], reason: str) -> AfterValidator:
    """A range check: ``reason`` (e.g. 'must be > 0') is what the message says after ``[section] key in file``."""

    def check(value):
        if not ok(value):
            raise ValueError(reason)
        return value

    return AfterValidator(check)


# TOML integers are 64-bit (seed_key is a u64); a parser may accept any size, which would only fail much later inside
# torch or the Rust core.
Int = Annotated[int, Strict(), Kind('int'),
                _rule(lambda v: -2 ** 63 <= v < 2 ** 64, 'is out of the 64-bit integer range')]
Float = Annotated[float, Strict(), AllowInfNan(False), Kind('float')]
Bool = Annotated[bool, Strict(), Kind('bool')]
Str = Annotated[str, Strict(), Kind('str')]
StrList = Annotated[list[Annotated[str, Strict()]], Kind('str_list')]
FloatList = Annotated[list[Annotated[float, Strict(), AllowInfNan(False)]], Kind('float_list')]

Positive = _rule(lambda v: v > 0, 'must be > 0')
NonNegative = _rule(lambda v: v >= 0, 'must be >= 0')
UnitClosed = _rule(lambda v: 0 <= v <= 1, 'must be within [0, 1]')
UnitHalfOpen = _rule(lambda v: 0 <= v < 1, 'must be within [0, 1)')
Factor = _rule(lambda v: 0 < v <= 1, 'must be within (0, 1]')
SprtError = _rule(lambda v: 0 < v < 0.5, 'must be within (0, 0.5)')
Port = _rule(lambda v: 0 <= v <= 65535, 'must be within [0, 65535]')
SeedKey = _rule(lambda v: v == -1 or 0 <= v < 2 ** 64, 'must be -1 (random) or within [0, 2^64)')
NotEmpty = _rule(lambda v: bool(v.strip()), 'must not be empty or blank (leave the key out for no token)')
Version = _rule(lambda v: v in SUPPORTED_VERSIONS,
                f'must be {", ".join(map(str, SUPPORTED_VERSIONS[:-1]))} or {SUPPORTED_VERSIONS[-1]}')


def _one_of(choices: tuple[str, ...]) -> AfterValidator:
    # an empty choice ('' = none) is shown quoted, not as a blank between commas
    return _rule(lambda v: v in choices, f'must be one of {", ".join(c or repr(c) for c in choices)}')


PositiveInt = Annotated[Int, Positive]
NonNegativeInt = Annotated[Int, NonNegative]
Games = Annotated[PositiveInt, _rule(lambda v: v % 4 == 0,
                                     'must be a multiple of 4 (one duplicate set is 4 games with rotated seats)')]
PositiveFloat = Annotated[Float, Positive]
NonNegativeFloat = Annotated[Float, NonNegative]
# '' would resolve to the working directory (a state file written as a temp file beside it); the folders the
# processes empty are checked with their own message (config_paths.folder_errors)
Dir = Annotated[Str, _rule(lambda v: bool(v.strip()), 'must not be empty or blank: name a folder')]
File = Annotated[Str, _rule(lambda v: bool(v.strip()) and not v.endswith(('/', '\\')),
                            'must name a file (not empty, blank or ending in a path separator)')]


def key(doc: str, default: Any = ..., **kw) -> Any:
    """A field with its meaning; ``default`` omitted means the key is required."""
    return Field(default, description=doc, **kw)


def unfilled(doc: str) -> Any:
    """An optional key that is accepted but left out of the loaded dict when the file lacks it (its reader applies its
    own default, e.g. Mortal's scheduler ``init``)."""
    return Field(None, description=doc, json_schema_extra={'unfilled': True})


class Section(BaseModel):
    """A ``[section]`` table: its keys are fields; unknown keys pass through (reported as warnings)."""

    model_config = ConfigDict(extra='allow', populate_by_name=True)


# ------------------------------------------------------------------------------------------------------------------
# Sections

class Control(Section):
    version: Annotated[Int, Version] = key(
        'model/feature version (1-4; the trainer takes 2-4); 4 adds the single-player block (mortal.features.obs_v4)')
    online: Bool = key('online training: replays come from the server, no CQL term (unless [cql] '
                       'online_min_q_weight)')
    state_file: File = key('trainer checkpoint (read at start, written every save_every steps)')
    best_state_file: File = key('copy of the checkpoint with the best test-play result')
    tensorboard_dir: Dir = key('TensorBoard event directory')
    device: Str = key("torch device of the trainee, e.g. 'cuda:0' or 'cpu'")
    enable_cudnn_benchmark: Bool = key('torch.backends.cudnn.benchmark while training')
    enable_amp: Bool = key('automatic mixed precision for training')
    enable_compile: Bool = key('torch.compile the trainee')
    batch_size: PositiveInt = key('samples per backward pass')
    opt_step_every: PositiveInt = key('backward passes per optimizer step (gradient accumulation)')
    save_every: PositiveInt = key('steps between checkpoints; a multiple of opt_step_every')
    test_every: PositiveInt = key('steps between test plays; a multiple of save_every')
    submit_every: PositiveInt = key('steps between parameter submissions to the server (online)')


SPECULATE_DOC = ("extra: decide the step after a call step in the same forward as the call, in case every asked seat "
                 "passes (OneVsThree(speculate_passes)): more rows per forward, a few computed for nothing; meant for "
                 "a GPU, where a forward costs about the same at any size (bench/gpu.sh --arena; 6-8% slower on a "
                 "CPU); false = Mortal's one step per forward")


class TrainPlay(Section):
    games: Games = key('games per client round (multiple of 4)')
    log_dir: Str = key('where the client writes its self-play logs (wiped each round)')
    boltzmann_epsilon: Annotated[Float, UnitClosed] = key('probability of sampling instead of acting greedily')
    boltzmann_temp: PositiveFloat = key('temperature of the Boltzmann sampling over Q')
    top_p: Annotated[Float, Factor] = key('nucleus (top-p) cut applied before sampling')
    repeats: PositiveInt = key('rounds played on the same seeds before moving on')
    speculate_passes: Bool = key(SPECULATE_DOC, False)
    counterfactual_rate: Annotated[Float, UnitClosed] = key(
        "extra: probability that a trainee decision (discard, call, kan, riichi) forks a counterfactual branch: "
        "a clone of the table (same wall) where the trainee takes its highest-Q other legal action, played by the "
        "same agents to the end of the kyoku, its outcome logged in the decision's meta.counterfactual for "
        "[online] counterfactual_weight (0 = off, as Mortal; needs stateless agents of version 1-3)", 0.0)
    counterfactual_alternative: Annotated[Str, _one_of(('best', 'other_kind', 'contested'))] = key(
        "extra: the action a counterfactual branch takes: 'best' (the trainee's highest-Q other legal action), "
        "'other_kind' (its highest-Q legal action of another kind: the pass for a call, riichi for a discard, a "
        "discard for a riichi) or 'contested' (only where the decision is contested, the other side: riichi vs the "
        "best dama discard, a call vs the pass (passes fork too), and after an opponent's riichi an unsafe discard "
        "vs the best genbutsu one; never at other discards); decisions without one fork nothing, and "
        "counterfactual_rate is the share of those that have one", 'best')


class TestPlay(Section):
    games: Games = key('games per test play (multiple of 4)')
    log_dir: Str = key('where test-play logs are written')
    best_rule: Annotated[Str, _one_of(BEST_RULES)] = key(
        "extra: when best.pth is replaced: 'paired' (the CI of the per-deal paired difference to best.pth below "
        "0), 'sprt' (the SPRT says better) or 'mortal' (avg pt and avg rank both not worse, Mortal's rule)",
        'paired')
    confidence: Annotated[Float, _rule(lambda v: 0.5 <= v < 1, 'must be within [0.5, 1)')] = key(
        'extra: two-sided confidence of the paired CI (best_rule, [guard])', 0.95)
    sprt_delta: Annotated[Float, Factor] = key(
        'extra: SPRT H1, the challenger better by this avg rank (H0: not better)', 0.05)
    sprt_alpha: Annotated[Float, SprtError] = key('extra: SPRT chance of calling an equal model better', 0.05)
    sprt_beta: Annotated[Float, SprtError] = key('extra: SPRT chance of missing a model better by sprt_delta', 0.05)
    sprt_chunk: Games = key('extra: games between two looks of the SPRT (multiple of 4)', 64)
    min_deals: NonNegativeInt = key(
        'extra: best.pth is replaced only by a test play of at least this many deals (4 games each; a CI over fewer '
        'is noise); fewer: not replaced, with a line saying why. The first test play (no best.pth yet) always makes '
        "it. 0 or 1 = any count, Mortal's rule", 8)
    fresh_deals: Bool = key("extra: every test play meets new deals and best.pth is played on them too (twice the "
                            "games; no winner's curse of a record on fixed deals); false = Mortal's fixed test seeds",
                            False)
    speculate_passes: Bool = key(SPECULATE_DOC, False)


class Dataset(Section):
    globs: StrList = key('glob patterns of gzip mjai logs (offline training)')
    file_index: File = key('cache of the expanded file list')
    file_batch_size: PositiveInt = key('log files decoded per shuffle pool')
    reserve_ratio: Annotated[Float, UnitHalfOpen] = key('fraction of a pool kept back to mix with the next')
    num_workers: NonNegativeInt = key('DataLoader worker processes')
    player_names_files: StrList = key('files listing player names whose actions are learned')
    num_epochs: PositiveInt = key('passes over the file list (offline)')
    enable_augmentation: Bool = key('also train on suit-permuted copies of each log')
    augmented_first: Bool = key('put the augmented copy before the original')
    max_log_bytes: PositiveInt = key('extra: largest decompressed log in bytes; a larger one is skipped (a '
                                     'decompression bomb)', DEFAULT_MAX_LOG_BYTES)


class Env(Section):
    gamma: Annotated[Float, Factor] = key('discount per decision step of the kyoku reward')
    pts: FloatList = key('reward points for final rank 1-4, used by the GRP reward', min_length=4, max_length=4)
    reward: Annotated[Str, _one_of(REWARDS)] = key(
        "extra: the kyoku reward: 'grp' (the GRP's change of expected pts, Mortal) or 'points' (the kyoku's score "
        'change x (max(pts) - min(pts)) / 30000; no GRP needed, mortal.data.reward)', 'grp')


class ResNet(Section):
    # the bounds of a baseline the server takes (mortal.net.wire.BASELINE_ARCH); 10^12 blocks hung the doctor
    conv_channels: Annotated[Int, _rule(lambda v: MIN_CONV_CHANNELS <= v <= MAX_CONV_CHANNELS, f'must be within '
                                        f'[{MIN_CONV_CHANNELS}, {MAX_CONV_CHANNELS}] (channel attention needs '
                                        f'{MIN_CONV_CHANNELS})')] = key('channels of the residual tower')
    num_blocks: Annotated[Int, _rule(lambda v: 1 <= v <= MAX_BLOCKS, f'must be within [1, {MAX_BLOCKS}]')] = key(
        'residual blocks')


class Cql(Section):
    min_q_weight: NonNegativeFloat = key('CQL regularizer weight (offline only; unused online)')
    online_min_q_weight: NonNegativeFloat = key('extra: CQL weight kept in online training (0 = none, as Mortal)',
                                                0.0)
    calibrated: Bool = key('extra: Cal-QL, the CQL push-down clamped at the Monte-Carlo return', False)


class Aux(Section):
    next_rank_weight: NonNegativeFloat = key('weight of the next-rank auxiliary cross entropy')


class FreezeBn(Section):
    mortal: Bool = key('keep BatchNorm statistics frozen (true for online training)')


class Scheduler(Section):
    peak: NonNegativeFloat = key('learning rate after warm-up (0 only for a control run)')
    final: NonNegativeFloat = key('learning rate after max_steps (cosine annealing in between)')
    warm_up_steps: NonNegativeInt = key('linear warm-up steps')
    max_steps: NonNegativeInt = key('end of cosine annealing (0 = constant after warm-up: final from its end on)')
    init: NonNegativeFloat | None = unfilled("extra: Mortal's scheduler argument, not in its config: learning rate at "
                                                      'step 0 of warm-up (Mortal default 1e-8)')
    offset: Int | None = unfilled("extra: Mortal's scheduler argument: steps added before evaluating the "
                                      'schedule (Mortal default 0)')
    epoch_size: NonNegativeInt | None = unfilled("extra: Mortal's scheduler argument: restart the schedule "
                                                     'every this many steps (0 = never)')


class Optim(Section):
    eps: PositiveFloat = key('AdamW eps')
    betas: Annotated[FloatList, _rule(lambda v: all(0 <= b < 1 for b in v), 'each beta must be within [0, 1)')] = \
        key('AdamW betas', min_length=2, max_length=2)
    weight_decay: NonNegativeFloat = key('AdamW weight decay (not applied to norms and biases)')
    max_grad_norm: NonNegativeFloat = key('gradient clipping norm (0 = no clipping)')
    scheduler: Scheduler | None = None


class ModelSlot(Section):
    device: Str = key("torch device of this model, e.g. 'cuda:0' or 'cpu'")
    enable_compile: Bool = key('torch.compile the model')
    state_file: File = key('checkpoint to load the model from (Mortal checkpoint layout)')


class TrainBaseline(ModelSlot):
    from_server: Bool = key("extra: a client fetches the trainer's baseline from the server when this file is "
                            'missing or holds other weights (the old one kept as .bak)', True)


class Baseline(Section):
    train: TrainBaseline | None = None
    test: ModelSlot | None = None


class Remote(Section):
    host: Str = key('server address (bind address for the server)')
    port: Annotated[Int, Port] = key('server TCP port (0 = any free port, server only)')
    token: Annotated[Str, NotEmpty] | None = key(
        'extra: shared secret every peer must send; required when host is not loopback', None)


class Server(Section):
    buffer_dir: Str = key('where submitted logs wait (wiped at server start)')
    drain_dir: Str = key('where drained logs are moved for the trainer (wiped at server start)')
    sample_reuse_rate: Float = key('accepted for compatibility; has no effect (as in Mortal)', 0)
    sample_reuse_threshold: Float = key('accepted for compatibility; has no effect (as in Mortal)', 0)
    capacity: PositiveInt = key('buffered log files at which clients are refused (back-pressure)')
    force_sequential: Bool = key('one client round per trainer parameter version; drain only when full')
    max_frame_bytes: PositiveInt = key('extra: largest accepted wire frame in bytes', DEFAULT_MAX_FRAME_BYTES)
    max_pending_connections: PositiveInt = key(
        'extra: connections that may be unauthenticated (sending their frame header) at once; a new one beyond '
        'this closes the oldest', DEFAULT_MAX_PENDING)
    max_inflight_bytes: NonNegativeInt = key(
        'extra: payload bytes the server reads or handles at once over all connections (0 = max_frame_bytes)', 0)
    payload_min_bytes_per_s: PositiveInt = key(
        'extra: bytes/s a frame payload must keep over every 2 s (or the rest of the frame within them), or its '
        'connection is closed', DEFAULT_PAYLOAD_MIN_RATE)


class Online(Section):
    history_window: PositiveInt = key('client rounds in the moving average of trainee ranks')
    enable_compile: Bool = key('torch.compile the trainee copy in the client')
    anchor_weight: NonNegativeFloat = key(
        "extra: weight of the MSE of untaken legal Q to the [baseline.train] model's Q (0 = off, as Mortal)", 0.0)
    counterfactual_weight: NonNegativeFloat = key(
        "extra: weight of the counterfactual term, the mean over samples with a branch of ((Q[alternative] - "
        "Q[taken]) - delta)^2, delta the paired difference of the branch's and the real kyoku's value by [env] "
        "reward ([train_play.<profile>] counterfactual_rate; 0 = off, as Mortal)", 0.0)
    offline_batch_size: Annotated[Int, _rule(lambda v: 0 <= v <= MAX_OFFLINE_BATCH,
                                             f'must be within [0, {MAX_OFFLINE_BATCH}]')] = key(
        'extra: offline samples of [dataset] appended to each online batch (RLPD-style), with the offline CQL term '
        'at [cql] min_q_weight (0 = off, as Mortal)', 0)
    restart_after_test_play: Bool = key(
        'extra: the learner exits after each test play and its supervisor starts a fresh one after 3 s, which reads '
        'the config and the baseline again (true, as Mortal, whose learner hung otherwise); false: it trains on in '
        'the same process, and an edit takes effect when train.py is restarted by hand', True)
    no_param_warn_minutes: NonNegativeFloat = key(
        'extra: a client that has had no new parameters for this many minutes (the trainer stopped, or its '
        'supervisor waits for a valid config) says so at WARNING, once a minute (0 = never, as Mortal)', 10.0)
    remote: Remote | None = None
    server: Server | None = None


class MortalSide(Section):
    """A side of a 1v3 run that plays a checkpoint."""

    type: Annotated[Str, _rule(lambda v: v in ('mortal', 'rulebase'), "must be 'mortal' or 'rulebase'")] = key(
        "extra: 'mortal' (a checkpoint) or 'rulebase' (mjai's RulebaseBot; needs only name)", 'mortal')
    device: Str = key('torch device of this engine')
    name: Str = key('engine name written into the logs')
    state_file: File = key('checkpoint to load')
    stochastic_latent: Bool = key('sample the latent instead of taking its mean (Mortal v1 models only)')
    enable_compile: Bool = key('torch.compile the model')
    enable_amp: Bool = key('autocast inference')
    enable_rule_based_agari_guard: Bool = key('never let the model decline a hora that a rule allows')


class RulebaseSide(Section):
    """A side of a 1v3 run played by mjai's RulebaseBot: the model keys are optional (checked when given)."""

    type: Literal['rulebase']
    name: Str = key('engine name written into the logs')
    device: Str | None = unfilled('')
    state_file: Str | None = unfilled('')
    stochastic_latent: Bool | None = unfilled('')
    enable_compile: Bool | None = unfilled('')
    enable_amp: Bool | None = unfilled('')
    enable_rule_based_agari_guard: Bool | None = unfilled('')


# Pydantic puts the tag into an error's location; config.py drops location parts in angle brackets.
MORTAL_TAG, RULEBASE_TAG = '<mortal side>', '<rulebase side>'


def _side_tag(value) -> str:  # of a table, or of a model when pydantic serializes one
    kind = value.get('type') if isinstance(value, dict) else getattr(value, 'type', None)
    return RULEBASE_TAG if kind == 'rulebase' else MORTAL_TAG


Side = Annotated[Union[Annotated[MortalSide, Tag(MORTAL_TAG)], Annotated[RulebaseSide, Tag(RULEBASE_TAG)]],
                 Discriminator(_side_tag)]


class Akochan(Section):
    enabled: Annotated[Bool, _rule(lambda v: not v, 'must be false: akochan is not supported')] = key(
        'use akochan as the champion (not supported here; must stay false)')
    dir: Str = key('akochan directory')
    tactics: Str = key('akochan tactics.json')


class OneVsThree(Section):
    seed_key: Annotated[Int, SeedKey] = key('duplicate seed key (-1 = random per run)', -1)
    games_per_iter: Games = key('games per iteration (multiple of 4)')
    iters: PositiveInt = key('iterations')
    log_dir: Str = key("where 1v3 logs are written ('' = none)")
    challenger: Side | None = None
    champion: Side | None = None
    akochan: Akochan | None = None


class GrpNetwork(Section):
    hidden_size: PositiveInt = key('GRU hidden size')
    num_layers: PositiveInt = key('GRU layers')


class GrpControl(Section):
    device: Str = key('torch device for GRP training')
    enable_cudnn_benchmark: Bool = key('torch.backends.cudnn.benchmark')
    tensorboard_dir: Dir = key('TensorBoard event directory for GRP training')
    batch_size: PositiveInt = key('GRP batch size')
    save_every: PositiveInt = key('steps between GRP checkpoints and validations')
    val_steps: PositiveInt = key('validation batches per validation')


class GrpDataset(Section):
    train_globs: StrList = key('glob patterns of training logs')
    val_globs: StrList = key('glob patterns of validation logs')
    file_index: File = key('cache of the expanded file lists')
    file_batch_size: PositiveInt = key('log files decoded per shuffle pool')


class GrpOptim(Section):
    lr: PositiveFloat = key('AdamW learning rate')


class Grp(Section):
    state_file: File = key('GRP checkpoint (reward model)')
    network: GrpNetwork | None = None
    control: GrpControl | None = None
    dataset: GrpDataset | None = None
    optim: GrpOptim | None = None


# Extras of the long-run guards (docs/operations.md); every default is Mortal's behaviour (nothing fires).
class Guard(Section):
    rollback_after: NonNegativeInt = key(
        'extra: roll back to best.pth after this many test plays in a row significantly worse than it (0 = never)', 0)
    max_policy_drift: Annotated[Float, UnitClosed] = key(
        'extra: roll back at a test play when diag/policy_drift is above this (0 = no bound)', 0.0)
    min_q_gap: NonNegativeFloat = key('extra: roll back at a test play when diag/q_gap is below this (0 = no bound)',
                                      0.0)
    lr_factor: Annotated[Float, Factor] = key('extra: the learning rate is multiplied by this at each rollback', 1.0)
    epsilon_factor: Annotated[Float, Factor] = key(
        "extra: the clients' boltzmann_epsilon is multiplied by this at each rollback", 1.0)


# Ours: `python -m mortal.tools.fleet` (self-play clients as Ray actors, docs/operations.md "Many machines").
class Fleet(Section):
    actors: PositiveInt = key('extra: self-play clients the fleet starts (--actors overrides)', 2)
    profiles: Annotated[StrList, _rule(bool, 'must name at least one profile')] = key(
        'extra: [train_play.<profile>] of each actor, in turn (actor i plays profiles[i % len])', ['default'])
    num_cpus: PositiveFloat = key('extra: CPUs Ray reserves for each actor (also its torch threads)', 1.0)
    num_gpus: Annotated[Float, UnitClosed] = key(
        'extra: GPU fraction Ray reserves for each actor (0.25: four actors share one GPU; 0 = CPU only)', 0.0)
    max_restarts: Annotated[Int, _rule(lambda v: v >= -1, 'must be -1 (no limit) or >= 0')] = key(
        "extra: Ray restarts a dead actor this many times (-1 = no limit)", -1)
    address: Str = key("extra: Ray cluster to join, e.g. 'ray-head:6379' ('' = start a local Ray instance; "
                       "--address overrides)", '')
    tensorboard_dir: Str = key("extra: TensorBoard directory of the fleet's records ('' = <[control] "
                               "tensorboard_dir>/fleet)", '')


# Ours: `python -m mortal.tools.bootstrap` (rule-based games -> GRP -> offline Mortal -> online dir).
class Bootstrap(Section):
    games: NonNegativeInt = key(
        'extra: training hanchan of rule-based bots to generate (a multiple of 4 when epsilon > 0)')
    val_games: NonNegativeInt = key('extra: validation hanchan (GRP validation split)')
    log_dir: Dir = key('extra: generated logs go to log_dir/train and log_dir/val')
    work_dir: Dir = key('extra: offline trainer state, TensorBoard and test-play logs')
    grp_steps: NonNegativeInt = key('extra: GRP training steps (a multiple of [grp.control] save_every)')
    workers: NonNegativeInt = key('extra: game-generation processes; 0 = one per CPU', 0)
    epsilon: Annotated[Float, UnitHalfOpen] = key(
        'extra: probability that a bot discards a random legal tile (never in riichi), so the four seat rotations of a '
        'deal differ', 0.01)
    seed_key: Annotated[Int, SeedKey] = key('extra: duplicate key of the train logs; validation uses seed_key + 1',
                                            0x6f6f7473)
    offline_test_every: NonNegativeInt = key(
        'extra: offline test play (vs 3 RulebaseBots) every n steps; 0 = never', 0)
    offline_test_games: Games = key('extra: games per offline test play', 8)
    offline_lr: NonNegativeFloat = key("extra: constant learning rate of the offline run; 0 = the config's "
                                       "[optim.scheduler]", 0.0)
    flaw: Annotated[Str, _one_of(BOOTSTRAP_FLAWS)] = key(
        "extra: a planted flaw of every bot's play (overcall, no-riichi, no-fold; mortal.play.flaws, for "
        "bench/learning.py flaw); '' = none", '')
    offline_max_epochs: PositiveInt = key(
        'extra: most offline epochs (one epoch = one Trainer pass, [dataset] num_epochs over the train logs); above '
        '1 the validation loss on the val logs picks the epoch kept as best.pth (1 = one epoch, best.pth = best test '
        'play or last)', 1)
    offline_patience: NonNegativeInt = key(
        'extra: stop the offline run after this many epochs in a row without a new lowest validation loss (0 = run '
        'all offline_max_epochs)', 1)
    grp_patience: NonNegativeInt = key(
        'extra: stop GRP training after this many validations ([grp.control] save_every) in a row without a new '
        'lowest cross entropy on the val logs, and keep the best (0 = train grp_steps, keep the last)', 0)


class Config(Section):
    """The whole file. A section the file lacks is ``None``, except the guards' extras, which are filled."""

    control: Control | None = None
    train_play: dict[str, TrainPlay] | None = None
    test_play: TestPlay | None = None
    dataset: Dataset | None = None
    env: Env | None = None
    resnet: ResNet | None = None
    cql: Cql | None = None
    aux: Aux | None = None
    freeze_bn: FreezeBn | None = None
    optim: Optim | None = None
    baseline: Baseline | None = None
    online: Online | None = None
    one_vs_three: OneVsThree | None = Field(None, alias='1v3')
    grp: Grp | None = None
    guard: Guard = Field(default_factory=Guard)
    fleet: Fleet = Field(default_factory=Fleet)
    bootstrap: Bootstrap | None = None


#: Every table with keys of its own, by dotted name (``train_play.*`` stands for each profile); the order is the
#: key table's (docs/config.md).
SECTIONS: dict[str, type[Section]] = {
    'control': Control, 'train_play.*': TrainPlay, 'test_play': TestPlay, 'dataset': Dataset, 'env': Env,
    'resnet': ResNet, 'cql': Cql, 'aux': Aux, 'freeze_bn': FreezeBn, 'optim': Optim,
    'optim.scheduler': Scheduler, 'baseline.train': TrainBaseline, 'baseline.test': ModelSlot, 'online': Online,
    'online.remote': Remote, 'online.server': Server, '1v3': OneVsThree, '1v3.challenger': MortalSide,
    '1v3.champion': MortalSide, '1v3.akochan': Akochan, 'grp': Grp, 'grp.network': GrpNetwork,
    'grp.control': GrpControl, 'grp.dataset': GrpDataset, 'grp.optim': GrpOptim, 'guard': Guard,
    'fleet': Fleet, 'bootstrap': Bootstrap,
}
# Tables that only hold sub-tables (no keys of their own).
CONTAINERS = ('train_play', 'baseline')
