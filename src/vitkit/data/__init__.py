"""Data: built-in offline datasets (scikit-learn digits, cluttered digits)."""

from vitkit.data.digits import ClutteredDigits, cluttered_digits, digits_split

__all__ = ["ClutteredDigits", "cluttered_digits", "digits_split"]
