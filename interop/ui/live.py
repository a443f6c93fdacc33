#!/usr/bin/env python3
"""The node page is live: one headless Chromium tab stays open while a pod is admitted, and
the pod must appear in that same tab, without a reload, by the page's own script.

Usage: live.py URL POD_NAME DOM_OUT -- COMMAND...

Drives Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ended by NUL on fds 3 and 4; no port, no websocket library). Opens URL, waits for the page's
script to have polled once, marks the window, runs COMMAND (the admission), then waits up to
20 s for POD_NAME in the DOM, checks the mark survived (no reload), and writes the DOM to
DOM_OUT for check.py.
"""

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, args):
        # Chromium reads commands on fd 3 and writes answers on fd 4. The pipe ends are moved
        # above 10 first, so that placing them on 3 and 4 in the child overwrites neither.
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome_r, from_chrome_w)]
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def child():
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        # close_fds=False: 3 and 4 must survive; every other pipe end is close-on-exec.
        self.proc = subprocess.Popen(args, preexec_fn=child, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self.to_chrome = to_chrome_w
        self.from_chrome = from_chrome_r
        self.buffer = b""
        self.next_id = 0

    def call(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_chrome, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main():
    url, pod, dom_out = sys.argv[1:4]
    command = sys.argv[sys.argv.index("--") + 1:]
    profile = tempfile.mkdtemp(prefix="devicelet-ui-chrome.")
    browser = Browser([
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-pipe",
        "about:blank",
    ])
    try:
        target = browser.call("Target.createTarget", {"url": url})["targetId"]
        session = browser.call("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]

        def js(expression):
            result = browser.call("Runtime.evaluate",
                                  {"expression": expression, "returnByValue": True},
                                  session)["result"]
            return result.get("value")

        deadline = time.time() + 20
        while "generation" not in (js("document.getElementById('status') && "
                                      "document.getElementById('status').textContent") or ""):
            if time.time() > deadline:
                sys.exit("live: the page's script never polled")
            time.sleep(0.2)
        if pod in js("document.getElementById('picture').textContent"):
            sys.exit(f"live: {pod} is on the page before it was admitted")
        js("window.__devicelet_mark = 'same page'")
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        deadline = time.time() + 20
        while pod not in js("document.getElementById('picture').textContent"):
            if time.time() > deadline:
                sys.exit(f"live: {pod} never appeared on the open page")
            time.sleep(0.2)
        if js("window.__devicelet_mark") != "same page":
            sys.exit("live: the page was reloaded, not updated")
        with open(dom_out, "w") as f:
            f.write(js("document.documentElement.outerHTML"))
        print(f"  {pod} appeared on the open page without a reload")
    finally:
        browser.close()


if __name__ == "__main__":
    main()
