"""The voices the speech models speak in and the characters their texts may use: the corpus' choices that a
speech vocabulary is built from (names only: importing this loads nothing)."""

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 ,.'?!-"
# voice name -> (engine, engine's voice argument). Four flite speakers and two espeak-ng variants.
VOICES: dict[str, tuple[str, str]] = {
    "slt": ("flite", "slt"), "awb": ("flite", "awb"), "rms": ("flite", "rms"), "kal": ("flite", "kal16"),
    "en-us-f3": ("espeak-ng", "en-us+f3"), "en-gb-m3": ("espeak-ng", "en-gb+m3"),
}
