"""Playing games: engine, agents, arena, duplicate evaluation; produces the mjai logs ``data`` reads."""
