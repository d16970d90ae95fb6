"""Utilities with no knowledge of Mahjong: atomic file writes, process lifetime, run locks."""
