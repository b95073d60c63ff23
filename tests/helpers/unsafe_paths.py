"""Artifact paths that are not safe names, each with the words of its refusal (evaluations/artifacts.py
check_path): what the API and the admin both refuse with 400."""

UNSAFE_ARTIFACT_PATHS = [
    ("../../../etc/passwd", "'..'"),
    ("..%2F..%2F..%2Fetc%2Fpasswd", "'..'"),
    ("%2e%2e/%2e%2e/secret", "'..'"),
    ("sub/../trajectory.json", "'..'"),
    ("./trajectory.json", "'.'"),
    ("%2Fetc%2Fpasswd", "empty name"),
    ("sub//dir/notes.md", "empty name"),
    ("sub/dir/", "empty name"),
    ("a%00b", "U+0000"),
    ("a%0Ab", "U+000A"),
    ("rtl%E2%80%AEtxt.exe", "U+202E"),
    ("a%5Cb", "backslash"),
    ("/".join(["d"] * 17), "more than 16 names deep"),
]
