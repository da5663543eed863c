"""The ``tilekiln`` command line: commands, progress, reports and inspection."""
