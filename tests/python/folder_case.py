"""A TestCase with a temporary folder of its own for each test: self.path(name) is a path in it."""
import os
import tempfile
import unittest


class FolderTestCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)
