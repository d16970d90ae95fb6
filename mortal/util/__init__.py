"""Utilities with no knowledge of Mahjong: atomic file writes, process lifetime (dying with the parent) and the
module the fork server preloads so that DataLoader workers watch their parent from the start.
"""
