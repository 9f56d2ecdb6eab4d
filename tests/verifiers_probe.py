"""Play gaca episodes through verifiers' own rollout code (run with .venv-verifiers).

A scripted OpenAI-compatible chat server on 127.0.0.1 plays the model: it answers each
request with one admissible action of the last user turn (the (turn + salt)-th, cyclic),
written as ``<think>..</think><action>..</action>``. Prints one JSON line: per episode the
task name, reward, metrics, trace info and the user turns the model saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def choose(messages: list[dict], salt: int) -> str:
    users = [m for m in messages if m["role"] == "user"]
    text = users[-1]["content"]
    if isinstance(text, list):
        text = "".join(part.get("text", "") for part in text)
    actions = text.split("Admissible actions: ")[-1].split("\n")[0].split("; ")
    return actions[(len(users) + salt) % len(actions)]


def serve(salt: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            action = choose(body["messages"], salt)
            content = f"<think>I pick {action}.</think><action>{action}</action>"
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            head = {"id": "c", "created": 0, "model": body["model"]}
            if not body.get("stream"):
                out = json.dumps({**head, "object": "chat.completion", "usage": usage,
                                  "choices": [{"index": 0, "finish_reason": "stop", "message":
                                               {"role": "assistant", "content": content}}]})
                return self.reply("application/json", out.encode())
            chunk = {**head, "object": "chat.completion.chunk"}
            events = [{**chunk, "choices": [{"index": 0, "finish_reason": None, "delta":
                                             {"role": "assistant", "content": content}}]},
                      {**chunk, "choices": [{"index": 0, "finish_reason": "stop",
                                             "delta": {}}]},
                      {**chunk, "choices": [], "usage": usage}]
            sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self.reply("text/event-stream", sse.encode())

        def reply(self, kind: str, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def play(args) -> list[dict]:
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig

    from gaca_verifiers import load_environment

    server = serve(args.salt)
    env = load_environment(args.env, tasks=args.tasks, seed=args.seed,
                           env_kwargs=json.loads(args.env_kwargs))
    client = EvalClientConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1",
                          api_key_var="GACA_PROBE_KEY")
    ctx = ModelContext(client=client, model="scripted")
    out = []
    async with env.serving():
        for task in env.taskset:
            (slot,) = env.slots(task)
            episode = await env.run_slot(slot, ctx)
            trace = episode.traces[0]
            out.append({"name": task.data.name, "info": task.data.info, "ok": episode.ok,
                        "errors": [e.message for e in episode.errors + trace.errors],
                        "reward": trace.reward, "metrics": trace.metrics,
                        "trace_info": trace.info,
                        "users": [m.content for m in trace.messages if m.role == "user"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", default="gaca/Diag-Signs-v0")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--salt", type=int, default=0)
    p.add_argument("--env-kwargs", default="{}", help="gym.make's kwargs, as JSON")
    args = p.parse_args()
    print(json.dumps(asyncio.run(play(args)), default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
