"""Stand-in for the npu-taskqueue ``task-submit`` client, written from its documented protocol.

Only what ``ci.queue`` uses: ``[--device auto] [--device-num N] [--max-time S] [--timeout W]
--run CMD``. Like the real client it refuses nested submission when ``TASKQUEUE_INSIDE`` is
set, refuses an unknown option, a non-positive ``--device-num`` and a card count larger than
the pool (exit 1, a Chinese ``错误:`` line on stderr), takes whole seconds only (0 = no limit /
wait forever; the default ``--max-time`` is 300 and ``--timeout`` 600), snapshots the
environment (minus ``TASKQUEUE_INSIDE``) into the task, then follows the task's log on stdout
and exits with the task's exit code. When ``--timeout`` runs out it prints ``错误: 等待超时
(Ws)``, withdraws the task if it is still queued and exits 1. SIGINT (130) and SIGTERM/SIGHUP
(143) withdraw a queued task (``已取消排队中的任务: ID``) or ask the daemon to kill a running
one and wait up to 5 s for it. ``FAKE_TQ_STATE`` names the state folder.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from layout import Layout  # noqa: E402

POLL = 0.05


def refuse(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)
    sys.exit(1)


def parse(argv: list[str]) -> dict:
    opts = {"device": None, "cards": None, "max_time": "300", "timeout": "600", "run": False}
    takes = {"--device": "device", "--device-num": "cards", "--max-time": "max_time",
             "--timeout": "timeout"}
    while argv and argv[0].startswith("--"):
        flag = argv.pop(0)
        if flag == "--run":
            opts["run"] = True
        elif flag in takes and argv:
            opts[takes[flag]] = argv.pop(0)
        else:
            refuse(f"错误: 未知选项 '{flag}'")
    if len(argv) != 1 or not opts["run"]:
        refuse("错误: 本替身只支持 --run \"command\"")
    if opts["cards"] is not None and not re.fullmatch(r"[1-9][0-9]*", opts["cards"]):
        refuse("错误: --device-num 必须为正整数")
    for key, flag in (("max_time", "--max-time"), ("timeout", "--timeout")):
        if not re.fullmatch(r"[0-9]+", opts[key]):
            refuse(f"错误: {flag} 必须为非负整数秒: '{opts[key]}'")
    if opts["device"] not in (None, "auto"):
        refuse("错误: 本替身只支持 --device auto")
    opts["command"] = argv[0]
    return opts


class Client:
    def __init__(self, q: Layout, task_id: str, timeout: int):
        self.q, self.id, self.timeout = q, task_id, timeout
        self.shown = 0

    def follow(self) -> None:
        log = self.q.logs / f"{self.id}.log"
        if log.exists():
            with open(log, "rb") as f:
                f.seek(self.shown)
                chunk = f.read()
            self.shown += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()

    def withdraw(self) -> bool:
        """Take the task back out of the queue; False once the daemon has claimed it."""
        try:
            os.rename(self.q.task(self.q.pending, self.id), self.q.task(self.q.withdrawn, self.id))
        except FileNotFoundError:
            return False
        self.q.event(ev="withdrawn", id=self.id)
        return True

    def on_signal(self, signum, _frame) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        code = 130 if signum == signal.SIGINT else 143
        if self.withdraw():
            print(f"\n已取消排队中的任务: {self.id}", file=sys.stderr, flush=True)
        elif self.q.task(self.q.running, self.id).exists():
            (self.q.kill / self.id).touch()
            print(f"\n已发送终止请求: {self.id}，等待确认...", file=sys.stderr, flush=True)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self.q.task(self.q.done, self.id).exists():
                time.sleep(POLL)
        sys.exit(code)

    def wait(self) -> int:
        t0 = time.monotonic()
        done = self.q.task(self.q.done, self.id)
        while not done.exists():
            self.follow()
            if self.timeout and time.monotonic() - t0 >= self.timeout:
                print(f"错误: 等待超时 ({self.timeout}s)", file=sys.stderr)
                if self.withdraw():
                    print(f"已取消仍在排队的任务: {self.id}（超时前未分配到设备）", file=sys.stderr)
                else:
                    print("任务仍在运行，将由 daemon 在 --max-time 到期后终止", file=sys.stderr)
                return 1
            time.sleep(POLL)
        self.follow()
        rc = json.loads(done.read_text())["exit_code"]
        print("=== 任务完成 (exit=0) ===" if rc == 0 else "=== 任务已终止 (killed) ===" if rc == 143
              else f"=== 任务失败 (exit={rc}) ===", flush=True)
        return rc


def main(argv: list[str]) -> int:
    if os.environ.get("TASKQUEUE_INSIDE"):
        refuse("错误: 禁止在 task-daemon 内部嵌套提交任务",
               "提示: 当前命令已在 task-daemon 中执行，直接运行即可")
    opts = parse(argv)
    q = Layout(os.environ["FAKE_TQ_STATE"])
    cards = int(opts["cards"] or 1)
    pool = q.pool()
    if cards > len(pool):
        refuse(f"错误: 请求 {cards} 张卡，但可分配范围内只有 {len(pool)} 张 "
               f"[{','.join(map(str, pool))}]，任务无法满足")
    task_id = time.strftime("task_%Y%m%d_%H%M%S_") + f"{os.getpid()}{random.randrange(10**4)}"
    env = {k: v for k, v in os.environ.items() if k != "TASKQUEUE_INSIDE"}
    spec = {"command": opts["command"], "cards": cards, "max_time": int(opts["max_time"]),
            "cwd": os.getcwd(), "env": env}
    client = Client(q, task_id, int(opts["timeout"]))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, client.on_signal)
    tmp = q.pending / f".{task_id}.tmp"
    tmp.write_text(json.dumps(spec))
    os.rename(tmp, q.task(q.pending, task_id))
    q.event(ev="submit", id=task_id, cards=cards, max_time=spec["max_time"])
    print(f"任务已提交: {task_id} (断开后可用 task-submit --wait {task_id} 重连)", file=sys.stderr,
          flush=True)
    return client.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
