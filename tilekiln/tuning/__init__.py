"""Tuning: measure which kernel is fastest per shape bucket, and keep the table beside the bundle.

    table.py    the bundle's tuning file (tuning.json): read, verify, write, overlay
"""
