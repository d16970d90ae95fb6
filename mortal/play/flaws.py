"""Planted flaws of the rule-based player for ``bench/learning.py flaw NAME``: ``flaw(bot, decision) -> decision``."""

from __future__ import annotations

import json
from typing import Callable

Flaw = Callable[[object, str], str]


def rulebase_discard(bot) -> str:
    """The ``dahai`` JSON ``RulebaseBot.think`` makes when it neither wins, riichis nor calls."""
    if bot.self_riichi_accepted:
        return bot.action_discard(bot.last_self_tsumo)
    for candidate in bot.find_improving_tiles():
        tile = candidate['discard_tile']
        if not bot.forbidden_tiles.get(tile[:2], True):
            return bot.action_discard(tile)
    return bot.action_discard(bot.last_self_tsumo or bot.tehai_mjai[0])


def overcall(bot, decision: str) -> str:
    """Pon (else chi) every discard the bot would pass on and may call. Shown by ``fuuro_rate``."""
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
    """Never declare riichi: make the discard the bot makes otherwise. Shown by ``riichi_rate``."""
    if json.loads(decision)['type'] == 'reach':
        return rulebase_discard(bot)
    return decision


def no_fold(bot, decision: str) -> str:
    """Never defend against a riichi: the teacher already does not, so unchanged. Shown by ``deal_in_after_riichi``."""
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
    """``(deal-ins, kyoku)`` of ``seat``: kyoku with an opponent's riichi, and deal-ins after it."""
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
    """``(numerator, denominator)`` of flaw ``name``'s statistic for ``seat`` in one game; KeyError if unknown."""
    _label, num, den, _doc = STATISTICS[name]
    if num is None:
        return deal_in_after_riichi(events, seat)
    from mortal.stat import Stat
    st = Stat.from_log(events, seat)
    return getattr(st, num), getattr(st, den)
