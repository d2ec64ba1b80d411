"""Stand-in rows for the datasets Atropos' env files load by name (no hub here), and `install()`, which makes
`datasets.load_dataset(NAME, ...)` return them. Runs in our venv and in atroposlib's (standard library and
`datasets` only). A name with no stand-in keeps `datasets`' own behaviour (offline: its hub error).

Each stand-in is small and written for these tests: a few items, each answerable right and wrong by
`atropos_corpus_rule.answer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 6 pens. How many pens are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"},
    {"question": "Sara had 10 sweets and ate 4. How many are left?", "answer": "10 - 4 = 6\n#### 6"},
    {"question": "There are 5 cats with 4 legs each. How many legs?", "answer": "5 * 4 = 20\n#### 20"},
]
MCQA = [
    {
        "prompt": f"Which option names the {topic}?\nA) alpha\nB) beta\nC) gamma\nD) delta",
        "answer": index,
        "ground_truth": "ABCD"[index],
        "options": ["alpha", "beta", "gamma", "delta"],
    }
    for topic, index in (("first letter", 0), ("second letter", 1), ("third letter", 2), ("fourth letter", 3))
]
TOOL_ROWS = [
    {
        "conversations": [
            {"from": "system", "value": "You may call tools. <tools>[]</tools>"},
            {"from": "human", "value": "What is the weather in Paris?"},
            {
                "from": "gpt",
                "value": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            },
        ]
    }
]

CITIES = [f"City{i}" for i in range(104)]  # tool_calling_server.py holds 100 rows out for its test split
XLAM = [
    {
        "conversations": [
            {"from": "system", "value": '<tools>[{"name": "get_weather", "parameters": {"city": "string"}}]</tools>'},
            {"from": "human", "value": f"What is the weather in {city} today?"},
            {
                "from": "gpt",
                "value": "<tool_call>\n"
                + json.dumps({"name": "get_weather", "arguments": {"city": city}})
                + "\n</tool_call>",
            },
        ]
    }
    for city in CITIES
]

WILDCHAT = [  # rlaif_server.py: a conversation whose last (assistant) turn the env drops
    {
        "conversation": [
            {"role": "user", "content": f"Say hi to {who}."},
            {"role": "assistant", "content": f"Hi {who}!"},
        ]
    }
    for who in ("Ann", "Bob", "Cy", "Di")
]
REVERSAL = [{"text": text} for text in ("hello world", "stand in", "abc def", "tiny model")]


def clevr_rows() -> list[dict[str, Any]]:
    """clevr_cogen_a_train.py's rows: a tiny image, a counting question, the count in <answer> tags."""
    from PIL import Image

    return [
        {
            "image": Image.new("RGB", (4, 4), (40 * n, 0, 0)),
            "problem": f"Count the {n} cubes.",
            "solution": f"<answer> {n} </answer>",
        }
        for n in (1, 2, 3, 4)
    ]


def _png(shade: int) -> Any:
    from PIL import Image

    return Image.new("RGB", (4, 4), (0, shade, 0))


def clevr_complex_rows() -> list[dict[str, Any]]:
    """clevr_complex.py's rows: a tiny image, a counting question, the bare count as the solution."""
    return [{"image": _png(40 * n), "problem": f"Count the {n} cubes.", "solution": str(n)} for n in (1, 2, 3, 4)]


def ocr_vqa_rows() -> list[dict[str, Any]]:
    """ocr_vqa.py's rows: a tiny image (a book cover), questions and their answers (it asks the first)."""
    return [
        {"image": _png(50 * n), "questions": [f"Who wrote book number {n}?"], "answers": [f"Author {n}"]}
        for n in (1, 2, 3, 4)
    ]


CLOCK_TIME = (3, 5)  # pixmo_clocks.py asks the same question of every image: every clock shows this time


def clock_rows() -> list[dict[str, Any]]:
    return [{"image": _png(60 * n), "hour": CLOCK_TIME[0], "minute": CLOCK_TIME[1]} for n in (1, 2, 3)]


# pixmo_count.py fetches each row's image by URL (requests.get): a local server serves stand-in PNGs
PIXMO_COUNTS = {"apples": 1, "pears": 2, "plums": 3, "figs": 4}
_image_server: list[str] = []  # the base URL of this process's image server, once started


def _image_base_url() -> str:
    """Start (once per process) a 127.0.0.1 server answering every GET with a tiny PNG; stopped at exit."""
    if not _image_server:
        import atexit
        import io
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        buffer = io.BytesIO()
        _png(90).save(buffer, format="PNG")
        body = buffer.getvalue()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        atexit.register(server.shutdown)
        _image_server.append(f"http://127.0.0.1:{server.server_address[1]}")
    return _image_server[0]


def pixmo_count_rows() -> list[dict[str, Any]]:
    base = _image_base_url()
    return [{"image_url": f"{base}/{label}.png", "label": label, "count": n} for label, n in PIXMO_COUNTS.items()]


# pixmo_point_explanations.py: a question, its explanation (the first inline text), the image by URL
POINTS = {
    f"Where is marker {n} in the image?": f"marker {n} is in the {corner} corner"
    for n, corner in ((1, "top left"), (2, "top right"), (3, "bottom left"))
}


def point_rows() -> list[dict[str, Any]]:
    base = _image_base_url()
    return [{"image_url": f"{base}/point.png", "question": q, "inline_text": [a]} for q, a in POINTS.items()]


# fundamental_prediction_environment.py: 20 rows (it holds 5% out for its test split); the context states the outcome
FUNDAMENTALS = [
    {
        "context": f"Company {i}: the board signals the dividend is {answer} by {magnitude} percent.",
        "answer": answer,
        "magnitude": magnitude,
        "fundamental_metric": "dividend",
    }
    for i, (answer, magnitude) in enumerate([("raised", "5"), ("reduced", "3"), ("maintained", "0")] * 7)
][:20]


def _turn(who: str, value: str) -> dict[str, str]:
    return {"from": who, "value": value}


def _call(name: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"city": "Paris"}}) + "\n</tool_call>"


def _response(name: str, content: dict[str, Any]) -> str:
    return "<tool_response>\n" + json.dumps({"name": name, "content": content}) + "\n</tool_response>"


_TAXI_TOOLS = [{"name": n, "parameters": {"city": "string"}} for n in ("get_weather", "book_taxi")]
# tool_use_multiturn_server.py: two sequential calls, each answered by its tool. It shuffles without a seed, so
# every row is the same conversation: any order gives the same items on both sides.
SEQUENTIAL = [
    {
        "conversations": [
            _turn("system", f"You are a function calling AI model. <tools>{json.dumps(_TAXI_TOOLS)}</tools>"),
            _turn("human", "Check the weather in Paris, then book me a taxi there."),
            _turn("gpt", "<think>Weather first.</think>\n" + _call("get_weather")),
            _turn("tool", _response("get_weather", {"temp_c": 20})),
            _turn("gpt", "<think>Now the taxi.</think>\n" + _call("book_taxi")),
            _turn("tool", _response("book_taxi", {"booked": True})),
            _turn("gpt", "It is 20C in Paris and your taxi is booked."),
        ]
    }
] * 40

# tool_use_interleaved_thinking.py: numeric answers (it keeps those) it checks a python_interpreter call against.
# It picks rows with an unseeded Random and shuffles by os.urandom: every row is the same problem.
INTERLEAVED_PROBLEM = ("What is 3 + 4?", "7")
ACEREASON = [{"problem": INTERLEAVED_PROBLEM[0], "answer": INTERLEAVED_PROBLEM[1]}] * 60

# (name, config or None) -> rows; a split argument selects nothing: every split is the same rows
STANDINS: dict[tuple[str, str | None], list[dict[str, Any]]] = {
    ("gsm8k", "main"): GSM8K,
    ("openai/gsm8k", "main"): GSM8K,
    ("NousResearch/AcademicMCQA", "default"): MCQA,
    ("NousResearch/XLAM-Atropos", "default"): XLAM,
    ("interstellarninja/toolace_hermes_sequential_tool_use", None): SEQUENTIAL,
    ("interstellarninja/hermes_reasoning_tool_use", None): TOOL_ROWS,
    ("allenai/WildChat", None): WILDCHAT,
    ("NousResearch/company-fundamentals-prediction-lite", "default"): FUNDAMENTALS,
    ("NousResearch/Letter-Counting-Eval", None): [
        {"Prompt": f"How many {c}s are in the string {w}?", "Answer": str(w.count(c)), "DifficultyLevel": 1}
        for c, w in (("a", "banana"), ("p", "apple"))
    ],
    ("NousResearch/TextReversalDataset", None): REVERSAL,
}
STANDINS[("nvidia/AceReason-Math", None)] = ACEREASON


# --- single-turn math, formats, evaluate ---
# math_server.py / math_server_zero.py: DeepMath rows are gsm8k's questions (the fake answers them by question),
# the answer without `\boxed{}`; its eval sets (loaded in setup) hold the same questions
DEEPMATH = [{"question": r["question"], "final_answer": r["answer"].split("#")[-1].strip()} for r in GSM8K]
MATH_EVAL = [{"problem": r["question"], "answer": r["answer"].split("#")[-1].strip()} for r in GSM8K]
AMC_EVAL = [{"question": r["question"], "answer": r["answer"].split("#")[-1].strip()} for r in GSM8K]
# instruction_following_algorithm_environment.py: RLVR-IFeval rows (an instruction, its verifier as JSON); each
# instruction -> (an answer that follows it, one that does not)
IFEVAL_ANSWERS = {
    "Describe the harbour at dawn. Include the keywords tide and shell.": (
        "The tide rolls in over a pale shell.",
        "The harbour is quiet and grey.",
    ),
    "Describe a forest walk in lowercase letters only.": ("the pines are tall and green.", "The Pines Are Tall."),
    "Describe a market without using any commas.": ("the stalls sell bread and fish.", "bread, fish, and fruit."),
    "Describe a river and finish with the exact phrase That is all.": ("It runs slow. That is all.", "It runs."),
}
_IFEVAL_CHECKS = [
    {"func_name": "verify_keywords", "keyword_list": ["tide", "shell"]},
    {"func_name": "validate_lowercase"},
    {"func_name": "validate_no_commas"},
    {"func_name": "validate_end", "end_phrase": "That is all."},
]
IFEVAL = [
    {
        "messages": [{"role": "user", "content": text}],
        "ground_truth": json.dumps(check),
        "constraint": check["func_name"],
    }
    for text, check in zip(IFEVAL_ANSWERS, _IFEVAL_CHECKS, strict=True)
]
# eval_environments/gsm8k_eval.py (`--env.dataset_name atropos-corpus/gsm8k-eval`): each question is asked once,
# so the fake answers these right at first and EVAL_MISSED wrong at first
EVAL_GSM8K = [
    {"question": "Ann has 8 shells and finds 5 more. How many shells?", "answer": "8 + 5 = 13\n#### 13"},
    {"question": "A crate holds 9 jars. How many jars are in 3 crates?", "answer": "9 * 3 = 27\n#### 27"},
    {"question": "Ben had 15 coins and spent 6. How many are left?", "answer": "15 - 6 = 9\n#### 9"},
    {"question": "Each of 4 kites has 2 tails. How many tails?", "answer": "4 * 2 = 8\n#### 8"},
]
# eval_environments/obqa_eval.py: four-choice questions, the gold letter in answerKey
OBQA = [
    {
        "id": f"obqa-{i}",
        "question_stem": stem,
        "choices": {"text": ["sand", "water", "iron", "wood"], "label": ["A", "B", "C", "D"]},
        "answerKey": key,
    }
    for i, (stem, key) in enumerate(
        [
            ("Which of these is wet?", "B"),
            ("Which of these rusts?", "C"),
            ("Which of these burns in a campfire?", "D"),
            ("Which of these fills an hourglass?", "A"),
        ]
    )
]
EVAL_MISSED = {EVAL_GSM8K[1]["question"], EVAL_GSM8K[3]["question"], OBQA[0]["question_stem"], OBQA[2]["question_stem"]}
# pydantic_schema_following_environment.py: a prompt, the pydantic model's code and name; PYDANTIC_RECORDS holds the
# record each prompt asks for (the fake writes it in the format the system prompt names, or leaves `age` out)
_PET = "class Pet(BaseModel):\n    name: str\n    age: int\n    species: Literal['cat', 'dog']\n"
PYDANTIC_RECORDS = {
    f"Write the Pet record for {name}, a {age}-year-old {species}.": {"name": name, "age": age, "species": species}
    for name, age, species in (("Rex", 3, "dog"), ("Tom", 5, "cat"), ("Bo", 2, "dog"), ("Kit", 7, "cat"))
}
PYDANTIC = [
    {
        "problem_id": f"pet-{i}",
        "task_type": "generation",
        "prompt": prompt,
        "verification_info": json.dumps({"pydantic_config": _PET, "model_name": "Pet"}),
    }
    for i, prompt in enumerate(PYDANTIC_RECORDS)
]
# answer_format_environment.py (its dataset_configs set to this one alone): questions the format is asked for
ANSWER_FORMAT = [
    {"prompt": f"Name a colour of the {thing}.", "answer": colour}
    for thing, colour in (("sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"))
]
# community/sql_query_env: WikiSQL (it downloads a tarball; here its cache folder holds stand-in files), one table;
# each question -> (a query that answers it, one that does not)
WIKISQL_TABLE = {"id": "t1", "header": ["Name", "Age"], "rows": [["Ann", 31], ["Bob", 42], ["Cy", 27], ["Di", 35]]}
SQL_ANSWERS = {
    f"How old is {name}?": (f"SELECT Age FROM data WHERE Name = '{name}'", "SELECT Age FROM data WHERE Name = 'Zed'")
    for name, _ in WIKISQL_TABLE["rows"]
}
FORMAT_STANDINS: dict[tuple[str, str | None], list[dict[str, Any]]] = {
    ("zwhe99/DeepMath-103K", None): DEEPMATH,
    ("HuggingFaceH4/aime_2024", None): MATH_EVAL,
    ("HuggingFaceH4/math-500", None): MATH_EVAL,
    ("math-ai/amc23", None): AMC_EVAL,
    ("allenai/RLVR-IFeval", None): IFEVAL,
    ("atropos-corpus/gsm8k-eval", None): EVAL_GSM8K,
    ("justus27/pydantic-adherance-test", None): PYDANTIC,
    ("allenai/openbookqa", "main"): OBQA,
    ("atropos-corpus/answer-format", None): ANSWER_FORMAT,
}
STANDINS.update(FORMAT_STANDINS)


# --- single-turn code: code_execution_server/coding_server.py (its tests run by tests/standins/modal) ---
# problem -> (right program, wrong program); the tests are stdin -> stdout pairs, as JSON (the env decodes them)
CODE = {
    "Read two integers a and b on one line and print their sum.": (
        "a, b = map(int, input().split())\nprint(a + b)",
        "a, b = map(int, input().split())\nprint(a - b)",
    ),
    "Read a word and print it reversed.": ("print(input().strip()[::-1])", "print(input().strip())"),
}
_CODE_TESTS = {
    "Read two integers a and b on one line and print their sum.": {
        "input": ["2 3\n", "10 -4\n"],
        "output": ["5\n", "6\n"],
    },
    "Read a word and print it reversed.": {"input": ["abc\n", "level\n"], "output": ["cba\n", "level\n"]},
}
CODE_ROWS = [
    {"problem": problem, "tests": json.dumps(tests), "problem_type": "stdin_stdout"}
    for problem, tests in _CODE_TESTS.items()
]
STANDINS[("NousResearch/RLVR_Coding_Problems", None)] = CODE_ROWS
STANDINS[("NousResearch/lcb_test", None)] = CODE_ROWS[:1]
STANDINS_PATH = str(Path(__file__).parent / "standins")  # stand-in packages (modal): the corpus runs put it on sys.path


BUILT = {("leonardPKU/clevr_cogen_a_train", None): clevr_rows}  # rows built when asked for (they need pillow)
BUILT[("MMInstruction/Clevr_CoGenT_TrainA_70K_Complex", None)] = clevr_complex_rows
BUILT[("howard-hou/OCR-VQA", None)] = ocr_vqa_rows
BUILT[("junyeong-nero/clock-dataset", None)] = clock_rows
BUILT[("allenai/pixmo-count", None)] = pixmo_count_rows
BUILT[("allenai/pixmo-point-explanations", None)] = point_rows


def rows_for(path: str, name: str | None) -> list[dict[str, Any]] | None:
    build = BUILT.get((path, name)) or BUILT.get((path, None))
    return build() if build else STANDINS.get((path, name)) or STANDINS.get((path, None))


# letter_counting_environment.py: NLTK's `words` corpus (nltk.download needs the network), a stand-in word list
WORDS = ["banana", "letter", "counting", "apple", "strawberry", "mississippi", "bookkeeper", "rhythm", "queue"]


def _nltk_words() -> None:
    """NLTK's `words` corpus as a stand-in word list under the corpus cache, put first on nltk's data path."""
    import os

    root = os.path.join(os.environ.get("ATROPOS_CORPUS_CACHE", "/tmp/atropos-corpus-cache"), "nltk_data")
    folder = os.path.join(root, "corpora", "words")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "en"), "w") as f:
        f.write("\n".join(WORDS) + "\n")
    try:
        import nltk
    except ImportError:
        return
    if root not in nltk.data.path:
        nltk.data.path.insert(0, root)


def _wikisql() -> None:
    """WikiSQL's files (its loader's cache layout) holding WIKISQL_TABLE's questions, named by WIKISQL_CACHE_DIR."""
    import os

    root = os.path.join(os.environ.get("ATROPOS_CORPUS_CACHE", "/tmp/atropos-corpus-cache"), "wikisql")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    questions = [
        {"question": f"How old is {name}?", "table_id": "t1", "sql": {"sel": 1, "agg": 0, "conds": [[0, 0, name]]}}
        for name, _ in WIKISQL_TABLE["rows"]
    ]
    for split in ("train", "dev", "test"):
        with open(os.path.join(root, "data", f"{split}.jsonl"), "w") as f:
            f.write("".join(json.dumps(q) + "\n" for q in questions))
        with open(os.path.join(root, "data", f"{split}.tables.jsonl"), "w") as f:
            f.write(json.dumps(WIKISQL_TABLE) + "\n")
        open(os.path.join(root, "data", f"{split}.db"), "w").close()  # the loader checks these exist
    os.environ["WIKISQL_CACHE_DIR"] = root


def install() -> None:
    """Patch `datasets.load_dataset` (and the name env files import from it) to serve the stand-ins."""
    import datasets

    _nltk_words()
    _wikisql()

    original = datasets.load_dataset

    def load_dataset(path: str, name: str | None = None, *args: Any, split: Any = None, **kwargs: Any) -> Any:
        rows = rows_for(path, name)
        if rows is None:
            return original(path, name, *args, split=split, **kwargs)
        data = datasets.Dataset.from_list(rows)
        return data if split is not None else datasets.DatasetDict({"train": data, "test": data})

    datasets.load_dataset = load_dataset
