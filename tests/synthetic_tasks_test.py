#!/usr/bin/env python3
"""Checks scripts/make-synthetic-tasks (docs/synthetic-tasks.md) on a small run: the same
arguments give the same bytes, every record's `expected` is valid under its schema (types,
enums, required, bounds, formats) and holds only what its document says (every extracted
string a substring, every number written as its JSON text, the first occurrence on word
boundaries: where `deg train` looks), and the tasks together have every field kind issue #16
names.

Runs in a few seconds (ctest `synthetic_tasks`); needs python3, zstd and the committed corpus.
The end-to-end check, `deg train` reporting `unlocated_values: 0` on the tasks, is in
docs/synthetic-tasks.md.
"""
import datetime
import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "make-synthetic-tasks"
ARGS = ["--tasks", "6", "--train", "30", "--dev", "5"]
KINDS = ["date", "amount", "person", "org", "place", "email", "url", "bool", "choice", "list",
         "items", "object"]
LEAF_TYPES = {"date": {"string"}, "amount": {"number", "string"}, "person": {"string"},
              "org": {"string"}, "place": {"string"}, "email": {"string"}, "url": {"string"}}


def generate(out, *extra):
    subprocess.run([sys.executable, str(SCRIPT), str(out), *ARGS, *extra], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def resolve(schema, root):
    """A schema with its local $ref ("#/$defs/x") merged in, the outer keywords first."""
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def types_of(schema):
    t = schema.get("type")
    return {t} if isinstance(t, str) else set(t or [])


def has_type(value, t):
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    return t == "null" and value is None


FORMATS = {
    "email": re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$"),
    "uri": re.compile(r"^[a-z][a-z0-9+.-]*://\S+$"),
}


def validate(value, schema, root, path, errors):
    """JSON Schema validation of the keywords the generator writes; errors get 'path: why'."""
    s = resolve(schema, root)
    types = types_of(s)
    if types and not any(has_type(value, t) for t in types):
        errors.append(f"{path}: {value!r} is not {sorted(types)}")
        return
    if "enum" in s and value not in s["enum"]:
        errors.append(f"{path}: {value!r} is not one of {s['enum']}")
    if isinstance(value, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in value:
                errors.append(f"{path}: required {k!r} missing")
        for k, v in value.items():
            if k not in props:
                errors.append(f"{path}: {k!r} is not a declared property")
            else:
                validate(v, props[k], root, f"{path}/{k}", errors)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            validate(v, s.get("items", {}), root, f"{path}/{i}", errors)
        if s.get("uniqueItems") and len({json.dumps(v) for v in value}) != len(value):
            errors.append(f"{path}: repeated items")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in s and value < s["minimum"] or "maximum" in s and value > s["maximum"]:
            errors.append(f"{path}: {value} out of bounds")
    elif isinstance(value, str):
        fmt = s.get("format")
        if fmt == "date":
            try:
                datetime.date.fromisoformat(value)
            except ValueError:
                errors.append(f"{path}: {value!r} is not a date")
        elif fmt in FORMATS and not FORMATS[fmt].match(value):
            errors.append(f"{path}: {value!r} is not {fmt}")


def extracted(value, schema, root, path):
    """(path, text) of every extracted value: strings of non-enum fields, numbers outside
    scores (an integer with both bounds is a choice of levels, not a span)."""
    s = resolve(schema, root)
    if isinstance(value, dict):
        for k, v in value.items():
            yield from extracted(v, s["properties"][k], root, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from extracted(v, s.get("items", {}), root, f"{path}/{i}")
    elif "enum" in s or isinstance(value, bool):
        return
    elif isinstance(value, str):
        yield path, value
    elif not ("minimum" in s and "maximum" in s):
        yield path, json.dumps(value)


def on_boundaries(doc, at, text):
    before = at == 0 or not (text[0].isalnum() and doc[at - 1].isalnum())
    end = at + len(text)
    return before and (end == len(doc) or not (text[-1].isalnum() and doc[end].isalnum()))


class SyntheticTasks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.a, cls.b = Path(cls.tmp.name) / "a", Path(cls.tmp.name) / "b"
        generate(cls.a)
        generate(cls.b)
        cls.manifest = json.loads((cls.a / "manifest.json").read_text())
        cls.tasks = {}  # name -> (schema, [(split, record)])
        for t in cls.manifest["tasks"]:
            folder = cls.a / t["name"]
            records = [(split, json.loads(line)) for split in ("train", "dev")
                       for line in (folder / f"{split}.jsonl").read_text().splitlines()]
            cls.tasks[t["name"]] = (json.loads((folder / "schema.json").read_text()), records)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def records(self):
        for name, (schema, records) in self.tasks.items():
            for split, rec in records:
                yield name, schema, split, rec

    def test_same_arguments_same_bytes(self):
        a, b = files_of(self.a), files_of(self.b)
        self.assertEqual(sorted(a), sorted(b))
        for path in a:
            self.assertEqual(a[path], b[path], path)

    def test_another_seed_other_records(self):
        c = Path(self.tmp.name) / "c"
        generate(c, "--seed", "1")
        a, c = files_of(self.a), files_of(c)
        self.assertNotEqual({k: v for k, v in a.items() if k.endswith(".jsonl")},
                            {k: v for k, v in c.items() if k.endswith(".jsonl")})

    def test_layout_and_counts(self):
        self.assertEqual(len(self.tasks), 6)
        self.assertEqual(sorted(p.name for p in self.a.iterdir() if p.is_dir()),
                         sorted(self.tasks))
        for name, (schema, records) in self.tasks.items():
            self.assertEqual(sum(s == "train" for s, _ in records), 30, name)
            self.assertEqual(sum(s == "dev" for s, _ in records), 5, name)
            self.assertEqual(schema.get("type"), "object", name)
            docs = [r["document"] for _, r in records]
            self.assertEqual(len(docs), len(set(docs)), f"{name}: a document repeats")

    def test_expected_is_valid_under_the_schema(self):
        for name, schema, split, rec in self.records():
            self.assertEqual(set(rec), {"document", "expected"})
            errors = []
            validate(rec["expected"], schema, schema, "", errors)
            self.assertEqual(errors, [], f"{name} {split}: {rec}")

    def test_no_nulls_or_empty_answers(self):
        def walk(v, path):
            self.assertIsNotNone(v, path)
            if isinstance(v, (list, dict)):
                self.assertTrue(v, f"{path}: empty")
                for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
                    walk(x, f"{path}/{k}")
        for name, _, split, rec in self.records():
            for k, v in rec["expected"].items():
                walk(v, f"{name} {split} /{k}")

    def test_extracted_values_are_in_the_document(self):
        for name, schema, split, rec in self.records():
            doc = rec["document"]
            for path, text in extracted(rec["expected"], schema, schema, ""):
                self.assertIn(text, doc, f"{name} {split} {path}")

    def test_first_occurrence_is_a_whole_value(self):
        # deg train takes a value's first occurrence (from the cursor, for array items): it
        # must not sit inside a longer word or number ("12" in "2012").
        for name, schema, split, rec in self.records():
            doc = rec["document"]
            for key, value in rec["expected"].items():
                s = resolve(schema["properties"][key], schema)
                if "enum" in s or isinstance(value, (bool, dict)):
                    continue
                items = value if isinstance(value, list) else [value]
                cursor = 0
                for item in items:
                    if isinstance(item, dict) or "enum" in resolve(s.get("items", {}), schema):
                        break
                    if isinstance(item, (int, float)) and "maximum" in s:
                        break  # a score
                    text = item if isinstance(item, str) else json.dumps(item)
                    at = doc.find(text, cursor)
                    self.assertTrue(on_boundaries(doc, at, text), f"{name} {split} /{key}: "
                                    f"{text!r} first found inside {doc[max(0, at - 10):at + 20]!r}")
                    if isinstance(value, list):
                        cursor = at + len(text)

    def test_every_field_kind_is_there(self):
        kinds = {}
        for t in self.manifest["tasks"]:
            schema = self.tasks[t["name"]][0]
            for f in t["fields"]:
                kinds.setdefault(f["kind"], []).append(t["name"])
                if "*" in f["pointer"] or f["pointer"].count("/") > 1:
                    continue
                s = resolve(schema["properties"][f["pointer"][1:]], schema)
                types = types_of(s) - {"null"}
                if f["kind"] == "bool":
                    self.assertEqual(types, {"boolean"}, f)
                elif f["kind"] == "choice":
                    self.assertIn("enum", s, f)
                elif f["kind"] == "list":
                    self.assertEqual(types, {"array"}, f)
                    self.assertNotEqual(resolve(s["items"], schema).get("type"), "object", f)
                elif f["kind"] == "items":
                    self.assertEqual(resolve(s["items"], schema).get("type"), "object", f)
                elif f["kind"] == "object":
                    self.assertEqual(types, {"object"}, f)
                    self.assertTrue(s.get("properties"), f)
                elif f["kind"] in LEAF_TYPES:
                    self.assertTrue(types and types <= LEAF_TYPES[f["kind"]], f)
        missing = [k for k in KINDS if k not in kinds]
        self.assertEqual(missing, [], f"no task has these field kinds; kinds: {sorted(kinds)}")

    def test_documents_are_short(self):
        words = sorted(len(rec["document"].split()) for _, _, _, rec in self.records())
        self.assertLessEqual(words[-1], 420)
        self.assertTrue(20 <= words[len(words) // 2] <= 200, words[len(words) // 2])

    def test_optional_fields_are_sometimes_absent(self):
        for name, (schema, records) in self.tasks.items():
            optional = set(schema["properties"]) - set(schema.get("required", []))
            present = [set(r["expected"]) for _, r in records]
            for key in set(schema.get("required", [])):
                self.assertTrue(all(key in p for p in present), f"{name}: required {key}")
            if optional:
                self.assertTrue(any(not optional <= p for p in present), name)


if __name__ == "__main__":
    unittest.main()
