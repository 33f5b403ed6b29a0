"""One module per ``bench`` command: its flags, its ``main``, its printing. Nothing imports a command module."""
