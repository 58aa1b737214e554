"""Offline harnesses: replay recorded streams through the real guard and processor."""
