"""Planted flaws of the rule-based player, for the planted-flaw benchmark (``bench/learning.py flaw NAME``).

A flaw is a small function ``flaw(bot, decision) -> decision`` over one decision of ``mjai``'s ``RulebaseBot``:
``bot`` is the bot (a ``mjai.Bot``, its state already updated with the event it reacts to), ``decision`` the mjai
action it chose (a JSON string such as ``{"type":"reach","actor":0}``), and the result the action the flawed
player plays instead. A bootstrap whose four seats all carry one flaw (``[bootstrap] flaw``) teaches it to the
offline model; the benchmark then asks whether self-play removes it, next to an offline-only control that by
construction cannot. Adding a flaw is one entry of ``FLAWS``, with the ``mortal.stat.Stat`` statistic that shows it
in ``STATISTICS``.

The teacher is ``RulebaseBot`` itself (mjai's ``mjai/bot/rulebase.py``): it wins whenever it can, declares riichi
whenever it can, pons a yakuhai that improves its shanten, calls further only once it has called, and discards the
first shanten-improving tile it may. It never defends: its discard ignores the riichi of others.
"""

from __future__ import annotations

import json
from typing import Callable

Flaw = Callable[[object, str], str]


def rulebase_discard(bot) -> str:
    """The discard ``RulebaseBot.think`` makes when it neither wins, declares riichi nor calls: the tsumo tile
    after its own riichi, else the first shanten-improving tile it may discard (kuikae), else the tsumo tile (or
    the first tile of the hand). Returns the mjai ``dahai`` JSON string."""
    if bot.self_riichi_accepted:
        return bot.action_discard(bot.last_self_tsumo)
    for candidate in bot.find_improving_tiles():
        tile = candidate['discard_tile']
        if not bot.forbidden_tiles.get(tile[:2], True):
            return bot.action_discard(tile)
    return bot.action_discard(bot.last_self_tsumo or bot.tehai_mjai[0])


def overcall(bot, decision: str) -> str:
    """Call every pon and chi offered: where the bot would pass (``none``) on another player's discard that it may
    pon or chi, it pons (the first pon candidate) or else chis (the first chi candidate). Wins, riichi and the
    bot's own calls are unchanged. Shown by ``fuuro_rate`` (kyoku with a call, per kyoku)."""
    if json.loads(decision)['type'] != 'none':
        return decision
    if bot.can_pon:
        pons = bot.find_pon_candidates()
        if pons:
            return bot.action_pon(consumed=pons[0]['consumed'])
    if bot.can_chi:
        chis = bot.find_chi_candidates()
        if chis:
            return bot.action_chi(consumed=chis[0]['consumed'])
    return decision


def no_riichi(bot, decision: str) -> str:
    """Never declare riichi: where the bot would declare, it makes the discard it makes otherwise
    (``rulebase_discard``), staying closed and dama. Shown by ``riichi_rate`` (riichi per kyoku)."""
    if json.loads(decision)['type'] == 'reach':
        return rulebase_discard(bot)
    return decision


def no_fold(bot, decision: str) -> str:
    """Never defend against a riichi: discard as if nobody had declared. ``RulebaseBot`` already does (its discard
    reads only its own hand), so against this teacher the flaw plants nothing and the decision is returned
    unchanged; ``bench/learning.py flaw no-fold`` refuses to run it and says so. Shown by the deal-in rate after
    an opponent's riichi (``deal_in_after_riichi``)."""
    return decision


FLAWS: dict[str, Flaw] = {'overcall': overcall, 'no-riichi': no_riichi, 'no-fold': no_fold}

# flaw -> (statistic, numerator, denominator, what it counts): the numerator and denominator are ``mortal.stat.Stat``
# fields (their ratio is the Stat property named), or None where ``statistic_counts`` reads the events itself
STATISTICS: dict[str, tuple[str, str | None, str | None, str]] = {
    'overcall': ('fuuro_rate', 'fuuro', 'round', 'kyoku with a call, per kyoku'),
    'no-riichi': ('riichi_rate', 'riichi', 'round', 'riichi per kyoku'),
    'no-fold': ('deal_in_after_riichi', None, None, "deal-ins into a riichi, per kyoku with an opponent's riichi"),
}


# flaws that plant nothing in RulebaseBot, with the reason the benchmark prints
VACUOUS: dict[str, str] = {
    'no-fold': "RulebaseBot never folds (its discard reads only its own hand), so the teacher already discards as if "
               "nobody had declared: no-fold plants nothing to remove. It needs a teacher that defends.",
}


def flaw_function(name: str | None) -> Flaw | None:
    """The flaw named ``name`` (``None`` or ``''``: none). Raises ValueError naming the known flaws."""
    if not name:
        return None
    if name not in FLAWS:
        raise ValueError(f'unknown flaw {name!r}: one of {sorted(FLAWS)}')
    return FLAWS[name]


def deal_in_after_riichi(events, seat: int) -> tuple[int, int]:
    """``(deal-ins, kyoku)`` of ``seat`` in one game's mjai events (dicts): kyoku in which an opponent's riichi
    was accepted (``reach_accepted``), and among them those in which ``seat`` dealt in (a ``hora`` by another player
    with ``target == seat``) after that acceptance. The rate of the no-fold flaw is their ratio."""
    deal_ins = kyoku = 0
    riichi = False
    for ev in events:
        kind = ev.get('type')
        if kind == 'start_kyoku':
            riichi = False
        elif kind == 'reach_accepted' and ev.get('actor') != seat and not riichi:
            riichi = True
            kyoku += 1
        elif kind == 'hora' and riichi and ev.get('target') == seat and ev.get('actor') != seat:
            deal_ins += 1
            riichi = False  # one deal-in per kyoku (a double ron counts once)
    return deal_ins, kyoku


def statistic_counts(name: str, events, seat: int) -> tuple[int, int]:
    """``(numerator, denominator)`` of flaw ``name``'s statistic (``STATISTICS``) for ``seat`` in one game's mjai
    events (dicts, ``start_game`` first). Summed over games, their ratio is the statistic; kept apart so that a CI
    can treat each deal as one cluster. Raises KeyError for an unknown flaw, and what ``mortal.stat.Stat.from_log``
    raises for a malformed log."""
    _label, num, den, _doc = STATISTICS[name]
    if num is None:
        return deal_in_after_riichi(events, seat)
    from mortal.stat import Stat
    st = Stat.from_log(events, seat)
    return getattr(st, num), getattr(st, den)
