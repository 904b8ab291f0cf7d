"""Pieces every tidemq service shares: settings base, constants, app factory, loops, runner."""
