"""Check stage: every kernel's derived plan and the rules that validate it against the facts."""
