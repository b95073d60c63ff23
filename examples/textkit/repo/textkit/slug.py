import re
import unicodedata


def slugify(text: str) -> str:
    """'Hello, World!' -> 'hello-world': ASCII letters and digits joined by single hyphens."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "-".join(re.findall(r"[a-z0-9]+", ascii_text.lower()))
