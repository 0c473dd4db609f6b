#!/usr/bin/env python3
"""Checks the committed pretraining corpus (data/corpus, built by scripts/build-corpus) and the
script's filters on small fixtures: no held-out e-mail enters it, no document or paragraph is
kept twice, every source is documented in docs/corpus.md, the manifest matches the files.

Runs in a few seconds without network (ctest `corpus`); needs python3, zstd and ../shared/data.
DEG_CORPUS_DIR points it at another built corpus (used to watch it fail on a broken one).
"""
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("DEG_CORPUS_DIR", ROOT / "data" / "corpus"))
SHARED = ROOT.parent / "shared" / "data"


def load_build_corpus():
    loader = importlib.machinery.SourceFileLoader("build_corpus", str(ROOT / "scripts" /
                                                                     "build-corpus"))
    spec = importlib.util.spec_from_loader("build_corpus", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


bc = load_build_corpus()
MANIFEST: dict = {}
DOCS: dict[str, list[str]] = {}  # source -> documents
RAW: dict[str, bytes] = {}
KEYS: dict[str, list[list[bytes | None]]] = {}  # source -> each document's paragraph keys


def load_corpus():
    if MANIFEST:
        return
    if not (CORPUS / "manifest.json").exists():
        raise AssertionError(f"no corpus at {CORPUS}: data/corpus is committed; rebuild it with "
                             "scripts/build-corpus data/corpus")
    MANIFEST.update(json.loads((CORPUS / "manifest.json").read_text()))
    for s in MANIFEST["sources"]:
        path = CORPUS / f"{s['source']}.txt.zst"
        RAW[s["source"]] = subprocess.run(["zstd", "-dcq", str(path)], check=True,
                                          capture_output=True).stdout
        docs = RAW[s["source"]].decode("utf-8").split(bc.SEPARATOR)
        if docs and docs[-1] == "":
            docs.pop()
        DOCS[s["source"]] = docs
        KEYS[s["source"]] = [[bc.paragraph_key(p) for p in bc.paragraphs(d)] for d in docs]


def split_hashes(name: str) -> set[str]:
    path = SHARED / "emails" / f"{name}.jsonl"
    if not path.exists():
        raise AssertionError(f"{path} not found: the e-mail splits live in shared/data")
    return bc.document_hashes(path)


def verbatim_sources() -> set[str]:
    return {s["source"] for s in MANIFEST["sources"] if s["verbatim"]}


class CommittedCorpus(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        load_corpus()

    def test_manifest_matches_the_files(self):
        listed = {f"{s['source']}.txt.zst" for s in MANIFEST["sources"]}
        present = {p.name for p in CORPUS.glob("*.zst")}
        self.assertEqual(listed, present, "data/corpus and manifest.json disagree")
        for s in MANIFEST["sources"]:
            raw = RAW[s["source"]]
            self.assertEqual(hashlib.sha256(raw).hexdigest(), s["sha256"], s["source"])
            self.assertEqual(len(raw), s["bytes"], s["source"])
            self.assertEqual(len(DOCS[s["source"]]), s["documents"], s["source"])
            self.assertTrue(raw.endswith(bc.SEPARATOR.encode()), s["source"])

    def test_every_source_is_documented_with_its_version_and_license(self):
        doc = (ROOT / "docs" / "corpus.md").read_text()
        for s in MANIFEST["sources"]:
            row = next((line for line in doc.splitlines()
                        if line.startswith(f"| `{s['source']}` |")), None)
            self.assertIsNotNone(row, f"docs/corpus.md has no table row for {s['source']}")
            self.assertIn(s["version"], row, f"{s['source']}: version missing in its row")
            self.assertIn(s["package"], row, f"{s['source']}: package missing in its row")
            self.assertIn(f"{s['documents']:,}", row, f"{s['source']}: stale document count")

    def test_sources_are_the_scripts_sources(self):
        self.assertEqual([s["source"] for s in MANIFEST["sources"]],
                         [s.name for s in bc.SOURCES])
        for s in MANIFEST["sources"]:
            source = next(x for x in bc.SOURCES if x.name == s["source"])
            self.assertEqual(s["version"], bc.package_version(source))

    def test_no_document_twice(self):
        seen: dict[str, str] = {}
        for source, docs in DOCS.items():
            for d in docs:
                h = bc.sha256(d)
                if h in seen:
                    self.fail(f"a document of {source} repeats one of {seen[h]}: {d[:80]!r}")
                seen[h] = source

    def test_no_paragraph_twice_outside_the_verbatim_emails(self):
        # verbatim sources register their paragraphs first; every other paragraph long enough
        # to be a duplicate appears once in the whole corpus
        verbatim = verbatim_sources()
        seen: set[bytes] = set()
        for source in verbatim:
            for keys in KEYS[source]:
                seen.update(k for k in keys if k)
        for source, docs in DOCS.items():
            if source in verbatim:
                continue
            for d, keys in zip(docs, KEYS[source]):
                self.assertGreaterEqual(len(d), bc.MIN_DOC_CHARS, source)
                for p, k in zip(bc.paragraphs(d), keys):
                    if k is None:
                        continue
                    if k in seen:
                        self.fail(f"{source}: duplicate paragraph {p[:80]!r}")
                    seen.add(k)

    def test_emails_are_train_split_messages_only(self):
        train, dev = split_hashes("train"), split_hashes("dev")
        emails = DOCS["spam_assassin_train"]
        for d in emails:
            h = bc.sha256(d)
            if h in dev:
                self.fail(f"a dev e-mail is in the corpus: {d[:120]!r}")
            if h not in train:
                self.fail(f"an e-mail that is not in train.jsonl: {d[:120]!r}")
        self.assertEqual(len(emails), len(train), "every train e-mail is in the package")

    def test_snips_requests_are_train_split_requests_not_in_dev(self):
        def documents(name):
            with open(SHARED / "snips" / f"{name}.jsonl", encoding="utf-8") as f:
                return {json.loads(line)["document"] for line in f}
        train, dev = documents("train"), documents("dev")
        lines = [u for d in DOCS["snips_train"] for u in d.rstrip("\n").split("\n")]
        self.assertGreater(len(lines), 12000)
        self.assertEqual(len(lines), len(set(lines)))
        for u in lines:
            if u in dev:
                self.fail(f"a SNIPS dev request is in the corpus: {u!r}")
            if u not in train:
                self.fail(f"a SNIPS request that is not in train.jsonl: {u!r}")

    def test_no_dev_email_paragraph_anywhere(self):
        # paragraphs that only held-out e-mails have (not shared with train: list footers are)
        def keys(name):
            with open(SHARED / "emails" / f"{name}.jsonl", encoding="utf-8") as f:
                return {k for line in f for p in bc.paragraphs(json.loads(line)["document"])
                        if (k := bc.paragraph_key(p))}
        held_out = keys("dev") - keys("train")
        self.assertGreater(len(held_out), 1000)
        for source, docs in DOCS.items():
            for d, keys in zip(docs, KEYS[source]):
                for p, k in zip(bc.paragraphs(d), keys):
                    if k in held_out:
                        self.fail(f"{source} holds a dev e-mail paragraph: {p[:80]!r}")


class Filters(unittest.TestCase):
    """build-corpus's filters on fixtures: they run without the corpus or the network."""

    def test_only_train_messages_are_selected(self):
        train_doc, other = "From a@b.c\nSubject: kept\n\nhello\n", "From x@y.z\n\nheld out\n"
        # each message comes as its candidate decodings; the one equal to a train document wins
        got = list(bc.select_train_emails([[other], [train_doc + " ", train_doc], [other, other]],
                                          {bc.sha256(train_doc)}))
        self.assertEqual(got, [train_doc])

    def test_snips_dev_requests_are_left_out(self):
        self.assertEqual(bc.select_train_utterances(["a", "b", "a", "c"], {"b"}), ["a", "c"])

    def test_near_duplicate_paragraphs_and_documents_are_dropped(self):
        stats = bc.DedupStats()
        dedup = bc.Dedup()
        para = "The quick brown fox jumps over the lazy dog, again and again and again."
        first = dedup.add(f"Intro that is long enough to count as a paragraph here.\n\n{para}\n\n"
                          + "x" * 70, False, stats)
        self.assertIsNotNone(first)
        # case, punctuation and spacing differ: still the same paragraph, dropped
        second_in = ("A new opening paragraph, different from anything before it.\n\n"
                     + para.upper().replace(",", " ;") + "\n\n" + "y" * 70)
        second = dedup.add(second_in, False, stats)
        self.assertNotIn("QUICK", second)
        self.assertEqual(stats.paragraphs_dropped, 1)
        # a document made mostly of kept paragraphs is a near-duplicate: dropped whole
        self.assertIsNone(dedup.add(f"{para}\n\nshort tail", False, stats))
        self.assertEqual(stats.near_duplicates, 1)
        # the same document twice
        self.assertIsNone(dedup.add(second_in, False, stats))
        self.assertEqual(stats.exact_duplicates, 1)

    def test_verbatim_documents_keep_their_bytes(self):
        stats = bc.DedupStats()
        dedup = bc.Dedup()
        mail = "Subject: x  \r\n\r\n\r\n\r\nbody line one that is long enough to be hashed\r\n"
        self.assertEqual(dedup.add(mail, True, stats), mail)

    def test_separator_never_survives_inside_a_document(self):
        stats = bc.DedupStats()
        out = bc.Dedup().add("before " + bc.SEPARATOR + " after" + "z" * 80, False, stats)
        self.assertNotIn(bc.SEPARATOR, out)


if __name__ == "__main__":
    unittest.main(verbosity=1)
