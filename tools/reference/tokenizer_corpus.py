#!/usr/bin/env python3
"""Builds tests/fixtures/tokenizers/corpus.jsonl: the texts every tokenizer conformance test runs.

Hand-written texts cover scripts, emoji sequences, code, numbers, whitespace runs, special-token
strings, very long words, combining marks and NFKC-sensitive characters; real documents come
from /work/shared/data/*/dev.jsonl (deterministic picks, e-mails cut to a window). Runs anywhere
with Python 3 (no HF needed); the expected outputs come from tokenizer_fixtures.py.

usage: tools/reference/tokenizer_corpus.py [--data /work/shared/data] [--out corpus.jsonl]
"""

import argparse
import json
import pathlib
import random

HAND = [
    # empty and tiny
    "",
    " ",
    "a",
    "\n",
    "  ",
    # English, apostrophes and case ((?i:'s|'t|...) in the Llama/Qwen split)
    "Hello world",
    "Hello, world! How are you doing today?",
    "I'M sure they'LL say it's fine, don't you think? We'd've known. O'Neil's DON'T",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
    "  leading spaces and trailing spaces   ",
    "CamelCaseIdentifiersLikeThisOne and snake_case_names_like_this_one",
    # European languages, accents precomposed and decomposed
    "Grüße aus München! Straße, Äpfel, Öl, Übermut.",
    "Café crème brûlée à la française, naïve façade, cœur, œuvre.",
    "Cafe\u0301 cre\u0300me bru\u0302le\u0301e (decomposed accents)",
    "El niño comió piñata el día de mañana. ¿Qué? ¡Olé!",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Tiếng Việt có rất nhiều dấu: ầ ẩ ẫ ấ ậ, Nguyễn Thị Minh Khai.",
    "İstanbul'da ılık bir gün; IŞIK ve ışık, İİİ ııı.",
    # Cyrillic, Greek, Armenian, Georgian
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Україна, Київ — їжак, ґанок, є.",
    "Γειά σου Κόσμε! ΟΔΥΣΣΕΥΣ, ὀδυσσεύς, σοφός ΣΟΦΟΣ.",
    "Բարեւ աշխարհ. გამარჯობა მსოფლიო.",
    # Arabic, Hebrew, Persian (right to left, with diacritics and digits)
    "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣٤٥ و 67890.",
    "اَلْعَرَبِيَّةُ لُغَةٌ جَمِيلَةٌ",
    "שלום עולם! זהו טקסט בעברית עם ניקוד: שָׁלוֹם.",
    "سلام دنیا، این یک متن فارسی است. ۱۲۳۴",
    # Indic
    "नमस्ते दुनिया! यह हिंदी पाठ है। क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़ (nukta forms) ०१२३४५",
    "ক\u09bc খ\u09bc বাংলা ভাষা। তামিল: வணக்கம் உலகம். తెలుగు: నమస్కారం.",
    "ਪੰਜਾਬੀ ਭਾਸ਼ਾ, ગુજરાતી ભાષા, ಕನ್ನಡ ಭಾಷೆ, മലയാളം ഭാഷ",
    # Thai, Lao, Khmer, Burmese (no spaces between words)
    "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ๑๒๓",
    "ສະບາຍດີ ພາສາລາວ. សួស្តី​ពិភពលោក. မင်္ဂလာပါ",
    # CJK
    "你好，世界！这是一个中文句子，包含标点符号。",
    "我爱北京天安门，天安门上太阳升。伟大领袖毛主席，指引我们向前进。",
    "こんにちは世界！日本語のテキスト、カタカナ、ひらがな、漢字。ｶﾀｶﾅ（半角）",
    "東京都千代田区丸の内１丁目９−１　ＴＥＬ：０３－１２３４－５６７８",
    "안녕하세요 세계! 한국어 텍스트입니다. 값싼 닭고기",
    "\u1112\u1161\u11ab\u1100\u1173\u11af (conjoining jamo)",
    "繁體中文：臺灣、香港。異體字：峯峰、裡裏。",
    # other scripts
    "ሰላም ልዑል! ኢትዮጵያ. ᐊᐃᖓᐃ. ᚠᚢᚦᚨᚱᚲ. ꦲꦏ꧀ꦱꦫꦗꦮ.",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝐁𝐨𝐥𝐝 𝑰𝒕𝒂𝒍𝒊𝒄 and 𓀀𓁐 hieroglyphs",
    # emoji
    "I love 🍕 and 🍣! 😀😃😄😁",
    "Family: 👨\u200d👩\u200d👧\u200d👦 couple: 👩\u200d❤\ufe0f\u200d💋\u200d👨 techie: 🧑🏽\u200d💻",
    "Skin tones: 👋🏻 👋🏼 👋🏽 👋🏾 👋🏿 thumbs 👍🏿",
    "Flags: 🇩🇪 🇯🇵 🇺🇸 🇧🇷 🇺🇦 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f 🏳\ufe0f\u200d🌈",
    "Keycaps 1\ufe0f\u20e3 #\ufe0f\u20e3 and ©\ufe0f ®️ ™️ ❤️ ☺︎",
    "🙂🙃" * 12,
    # code
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    '{"name": "deg", "version": "0.1.0", "tags": ["json", "schema"], "nested": {"a": [1, 2.5, -3e-7, null, true]}}',
    "<html>\n<head><title>Test</title></head>\n<body><h1>Title</h1><h5>small</h5><p>Para with <b>bold</b>, <sup>2</sup> and <a href=\"https://example.com/?q=1&x=2\">link</a>.</p></body>\n</html>",
    "SELECT id, name FROM users WHERE email LIKE '%@example.com' AND created_at >= '2024-01-01' ORDER BY id DESC;",
    "const re = /^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@example\\.(com|org)$/i; // regex\nx => x ** 2 !== y?.z ?? 0;",
    "fn main() { let s: &str = \"héllo\"; println!(\"{s:?} {}\", s.len()); }",
    "if (a<=b && c>=d || !e) { x += y; } else { x -= y; } // ==> <=> != === !==",
    "https://www.example.com/path/to/page.html?query=string&foo=bar#fragment user.name+tag@mail.example.co.uk",
    "C:\\Users\\Admin\\Documents\\file.txt /usr/local/bin/python3 ~/.config/nvim/init.lua",
    # numbers
    "1234567890 12345 1 12 123 1234 3.14159 2.71828 -42 +7 1,000,000 1.000.000,50 1e-10 0xDEADBEEF",
    "Dates: 2024-01-15, 15/01/2024, 01.15.2024, 15 Jan 2024 10:30:45 UTC+05:30",
    "Phone: +1 (555) 123-4567, +44 20 7946 0958. Price: $1,299.99 €45,50 £3 ¥1000 ₹500",
    "Full-width １２３４５ ＡＢＣ ａｂｃ， Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३, Thai ๑๒๓",
    "Superscripts x² y³ H₂O 10⁻⁶, fractions ½ ¼ ¾ ⅓, Roman Ⅻ ⅻ, circled ① ② ⑳",
    "0" * 40 + " " + "9876543210" * 8,
    # NFKC-sensitive characters
    "ﬁnancial ﬂow ﬀ ﬃ ﬄ ﬆ — ligatures; ㎏ ㎞ ㎡ ℃ ℉ № ℡ ™ Ⅸ; ﹙small﹚ ︵vertical︶",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　ｗｉｔｈ　ＩＤＥＯＧＲＡＰＨＩＣ　ｓｐａｃｅｓ！？",
    "Å Å Å (U+00C5, U+212B, A+ring) Ω Ω, ñ ñ, é é ë, ẛ̣ ḍ̇ ḍ̇",
    "a\u0301\u0323 a\u0323\u0301 o\u0308\u0304 u\u0308\u0301 q\u0307\u0323 (marks in both orders)",
    "Z̴̧̛̖̼̪̞͎͓̙̪̀͐̈́̃̽a̷̢̛̦̗̣̠͈̘̓̑̇͐̈́͝l̵̡̙̘͙̬̆̒̈́g̶̨̙̦̗̥̈́̀̈̂̚o̸̧̖̠̱͇̓̿̒̚",
    "\u0301\u0302 starts with marks, ends with marks e\u0301\u0301\u0301",
    # whitespace runs
    "word1    word2\t\tword3\n\nword4\r\nword5\r\n\r\nword6",
    "tabs\t\t\t\t\tand spaces          and newlines\n\n\n\n\n\nend",
    "\n\n\n\nstarts with newlines",
    "ends with newlines\n\n\n\n",
    "\t\tindented\n\t\t\tmore\n\t\tless\n",
    " \t \n \r\n \u00a0\u2003\u3000\u200b\u2028\u2029 mixed whitespace \u00a0nbsp\u00a0",
    " " * 300,
    "\n" * 120,
    "\t" * 40 + "x",
    "line one\rline two (bare CR)\rline three",
    # special-token strings inside text
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text before <|endoftext|> text after<|endoftext|><|endoftext|>",
    "<think>\nreasoning here\n</think>\n\nThe answer is 42.",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
    "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\nhi<end_of_turn><eos>",
    "<|start|>assistant<|channel|>analysis<|message|>Thinking...<|end|><|return|>",
    "<tool_call>{\"name\": \"f\"}</tool_call><tool_response>ok</tool_response>",
    "Partial tokens: <|im_sta <|im_end <|endoftext| <think </think <<|im_end|>> |im_start|",
    "<unused0><unused123> <pad><mask>[MASK] <s></s> <unk> <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
    "<|im_start|><|im_start|><|im_end|>",
    # very long words
    "a" * 1000,
    "supercalifragilisticexpialidocious" * 20,
    "Pneumonoultramicroscopicsilicovolcanoconiosis " * 5,
    "https://example.com/" + "very-long-path-segment/" * 30 + "index.html",
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAxMjM0NTY3ODk" * 8,
    "漢字" * 200,
    "αβγδεζηθικλμνξοπρστυφχψω" * 20,
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~" * 10,
    "ab" * 300 + " " + "x" * 257,
    # mixed
    "Mixed: English, русский, 中文, العربية, हिन्दी, ภาษาไทย, 日本語, 한국어, emoji 🎉.",
    "The price is 100€ (approx. $108.50) — see §3.2(a)…“quoted” ‘single’ «guillemets» „low“",
    "email: john.doe@example.com, phone: 555-0100, id: A-12345/B, ref#: 00042",
    "Invoice #INV-2024-0042\nDate: 2024-03-15\nBill To: ACME Corp., 123 Main St., Springfield\nTotal: USD 1,234.56\n",
    "Ünïcödé wïth lötš öf dïäçrïtïçš ând ŝṗéçíàł çĥàŕś",
    "\u00ad soft hyphen, \u200c ZWNJ \u200d ZWJ, \u2060 word joiner, \ufeff BOM, \u202e RLO",
    "\x00\x01\x02 control \x07 chars \x1b[31m ANSI \x7f DEL \x85 NEL",
    "\ufffd replacement char and \U0010fffd private use \ue000",
    # characters newer than the Unicode 8/9 tables HF's normalization crates use
    "New marks: \u09fe \u1abf \u0d00 \u0c3c \u1df6 a\u1abf\u0301 \u0b55; emoji \U0001f971 \U0001fae0; "
    "punctuation \u2e45 \U0001e95e \u2e4f \ua8fc \U00011a9b",
]


def load_real(data: pathlib.Path) -> list:
    """~50 real documents: e-mail windows, then short records from the other sets."""
    rng = random.Random(20261129)
    out = []
    picks = [("emails", 20), ("conll2003", 8), ("atis", 6), ("mit_movie", 5),
             ("mit_restaurant", 5), ("snips", 6)]
    for name, count in picks:
        path = data / name / "dev.jsonl"
        docs = [json.loads(line)["document"] for line in path.open(encoding="utf-8")]
        for doc in rng.sample(docs, count):
            if len(doc) > 600:
                start = rng.randrange(0, len(doc) - 600)
                doc = doc[start:start + 600]
            out.append(doc)
    return out


def main() -> None:
    here = pathlib.Path(__file__).resolve().parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--out", default=str(here.parent.parent / "tests/fixtures/tokenizers/corpus.jsonl"))
    args = ap.parse_args()
    texts = HAND + load_real(pathlib.Path(args.data))
    with open(args.out, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    print(f"{len(texts)} texts, {sum(len(t) for t in texts)} code points -> {args.out}")


if __name__ == "__main__":
    main()
