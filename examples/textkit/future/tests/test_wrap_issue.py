import unittest

from textkit import wrap


class WrapIssueTest(unittest.TestCase):
    def test_exact_width(self):
        self.assertEqual(wrap("aa bb cc", 5), ["aa bb", "cc"])

    def test_long_word_is_split(self):
        self.assertEqual(wrap("a abcdefgh b", 3), ["a", "abc", "def", "gh", "b"])


if __name__ == "__main__":
    unittest.main()
