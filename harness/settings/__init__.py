"""How a setting is declared once: its field carries its flag, help, default and comparability."""
