"""The ``lease_*`` settings: names, defaults, validation, and how task options override them.

:mod:`.config` resolves them, :mod:`.names` refuses a misspelt one, :mod:`.timing` checks the
three durations together, :mod:`.signal_setting` reads ``lease_signal``, :mod:`.debounce`
holds ``lease_debounce``'s, and :mod:`.publish` caches what a publish reads.
"""
