import unittest

from textkit import slugify


class SlugifyTest(unittest.TestCase):
    def test_punctuation_and_case(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_accents_are_dropped(self):
        self.assertEqual(slugify("Crème brûlée"), "creme-brulee")

    def test_nothing_left(self):
        self.assertEqual(slugify("!!!"), "")


if __name__ == "__main__":
    unittest.main()
