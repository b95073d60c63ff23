import unittest

from textkit import wrap


class WrapTest(unittest.TestCase):
    def test_breaks_between_words(self):
        self.assertEqual(wrap("the quick brown fox", 10), ["the quick", "brown fox"])

    def test_collapses_whitespace(self):
        self.assertEqual(wrap("  a \n b\tc  ", 80), ["a b c"])

    def test_empty_text_has_no_lines(self):
        self.assertEqual(wrap("", 10), [])

    def test_width_must_be_positive(self):
        with self.assertRaises(ValueError):
            wrap("a", 0)


if __name__ == "__main__":
    unittest.main()
