"""Small embedded training corpus for the tiny test tokenizers.

The text mixes English prose, chat vocabulary, source code and several scripts so that a few hundred
BPE merges turn common words (" the", "return", "assistant") into single tokens while rarer
characters (most CJK, every emoji) stay split across byte-level tokens. It is written for Baton and
kept fixed: changing it changes every tiny tokenizer's ids.
"""

TRAINING_CORPUS: tuple[str, ...] = (
    # English prose.
    "The quick brown fox jumps over the lazy dog, and then the dog runs after the fox into the forest.",
    "A language model reads a prompt, predicts the next token, and repeats until it reaches a stop token.",
    "The scheduler decides which requests run in the next step and how many tokens each of them may use.",
    "When the cache is full, the oldest blocks that no request is using are evicted first.",
    "This is a short story about a small robot that wanted to learn how to paint the sea at night.",
    "Every morning the robot walked to the beach, looked at the water, and tried another color.",
    "It is important that the answer is correct, that it is clear, and that it is kind to the reader.",
    "Please tell me the weather in Paris today and whether I should take an umbrella with me.",
    "There are three things to remember: read the question, think about the problem, then write the answer.",
    "The numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 and 1e-5 appear in many technical texts.",
    # Chat and tool vocabulary.
    "system user assistant tool function arguments name description parameters properties required type",
    "You are a helpful assistant. The user asked a question and the assistant answered with a tool call.",
    "The tool returned a result, and the assistant used the result to write the final answer for the user.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"type": "function", "function": {"name": "search", "description": "Search the web", '
    '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}',
    # Python.
    'def main() -> int:\n    return 0\n\n\nif __name__ == "__main__":\n    raise SystemExit(main())\n',
    "class Scheduler:\n    def __init__(self, max_tokens: int) -> None:\n"
    "        self.max_tokens = max_tokens\n"
    "        self.waiting: list[str] = []\n\n    def add(self, request: str) -> None:\n"
    "        self.waiting.append(request)\n",
    "for i in range(len(items)):\n    if items[i] is None:\n        continue\n"
    '    print(f"item {i}: {items[i]}")\n',
    "import torch\n\nx = torch.zeros(4, 8, dtype=torch.float32)\ny = x @ x.T\nassert y.shape == (4, 4)\n",
    "try:\n    value = int(text)\nexcept ValueError as err:\n"
    '    raise ValueError(f"bad value: {text!r}") from err\n',
    # Other languages.
    "function add(a, b) {\n  return a + b;\n}\nconst total = [1, 2, 3].map((x) => add(x, 1));\n",
    "fn main() {\n    let mut count = 0;\n    for word in text.split_whitespace() {\n"
    "        count += 1;\n    }\n}\n",
    "SELECT name, count(*) FROM requests WHERE status = 'done' GROUP BY name ORDER BY name;",
    # Multilingual text.
    "今天天气很好，我们去公园散步吧。我们的模型可以回答问题，也可以写代码。",
    "你好，世界。谢谢你的帮助，我们明天再见。",
    "こんにちは、世界。今日はとても良い天気ですね。明日また会いましょう。",
    "안녕하세요, 세계. 오늘 날씨가 정말 좋네요. 내일 다시 만나요.",
    "Привет, мир. Сегодня хорошая погода, и мы идём гулять в парк.",
    "Bonjour le monde. Il fait très beau aujourd'hui, et nous allons au café.",
    "Hallo Welt. Heute ist das Wetter schön, und wir gehen in den Park spazieren.",
    "Hola mundo. Hoy hace buen tiempo y vamos a caminar por el parque con nuestros amigos.",
    "مرحبا بالعالم. الطقس جميل اليوم.",
    "नमस्ते दुनिया। आज मौसम अच्छा है।",
    "Emoji appear in chats too: 🙂 👍 🚀 ❤️ 🎉",
)
