#!/usr/bin/env python3
"""Checks a DOM that headless Chromium dumped of devicelet's node page (serve --ui-address).

Usage: check.py DOM_FILE PODS_JSON RESOURCES_JSON SLICES_JSON PICTURE_JSON [HOSTILE_NAME]

The page must name, in each NUMA box (section.numa[data-numa=N]), exactly the pods that
`devicelet get pods -o json` places on node N: by the NUMA nodes of each container's exclusive
CPUs (the machine's CPUs per node from the picture JSON), memory blocks, device-plugin devices
(`get resources`) and claim devices (the ResourceSlices' resource.kubernetes.io/numaNode);
pods placed nowhere in the "no NUMA" box. The page's script must have run (the status line
names the picture's generation, which only the script writes). A hostile pod name, if given,
must show as text and never become an element.
"""

import json
import sys
from html.parser import HTMLParser


def cpus(text):
    out = []
    for part in filter(None, (text or "").split(",")):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def numa_of(attr):
    if attr is None:
        return []
    if "int" in attr:
        return [attr["int"]]
    return list(attr.get("ints") or [])


def expected(pods, resources, slices, picture):
    cpu_node = {c: n["id"] for n in picture["numaNodes"] for c in n["cpus"]["all"]}
    dev_nodes = {}
    for r in resources["resources"]:
        for d in r["devices"]:
            dev_nodes[(r["name"], d["id"])] = d.get("numaNodes") or []
    for s in slices["items"]:
        spec = s["spec"]
        key = spec["driver"] + "/" + spec["pool"]["name"]
        for d in spec.get("devices") or []:
            attrs = d.get("attributes") or {}
            dev_nodes[(key, d["name"])] = numa_of(attrs.get("resource.kubernetes.io/numaNode"))
    out = {}
    for p in pods["pods"]:
        name = p["pod"]["namespace"] + "/" + p["pod"]["name"]
        nodes = set()
        for c in p["containers"]:
            nodes.update(cpu_node[x] for x in cpus(c.get("cpus")))
            for block in c.get("memory") or []:
                nodes.update(block["numaNodes"])
            for resource, ids in (c.get("devices") or {}).items():
                for i in ids:
                    nodes.update(dev_nodes.get((resource, i), []))
            for claim in c.get("claims") or []:
                key = (claim["driver"] + "/" + claim["pool"], claim["device"])
                nodes.update(dev_nodes.get(key, []))
        for n in sorted(nodes) or ["none"]:
            out.setdefault(str(n), set()).add(name)
    return out


class Page(HTMLParser):
    """NUMA box id -> pod names (li.pod text), the status text, and every tag seen."""

    def __init__(self):
        super().__init__()
        self.boxes = {}
        self.box = None
        self.depth = 0
        self.in_pod = False
        self.pod_text = ""
        self.in_status = False
        self.status = ""
        self.tags = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        classes = (a.get("class") or "").split()
        if tag == "section" and "numa" in classes:
            self.box = a.get("data-numa")
            self.boxes.setdefault(self.box, set())
            self.depth = 0
        if tag == "section" and self.box is not None:
            self.depth += 1
        if tag == "li" and "pod" in classes and self.box is not None:
            self.in_pod = True
            self.pod_text = ""
        if a.get("id") == "status":
            self.in_status = True

    def handle_endtag(self, tag):
        if tag == "li" and self.in_pod:
            self.boxes[self.box].add(self.pod_text)
            self.in_pod = False
        if tag == "section" and self.box is not None:
            self.depth -= 1
            if self.depth == 0:
                self.box = None
        if tag == "span" and self.in_status:
            self.in_status = False

    def handle_data(self, data):
        if self.in_pod:
            self.pod_text += data
        if self.in_status:
            self.status += data


def main():
    dom_file, pods, resources, slices, picture_file = sys.argv[1:6]
    hostile = sys.argv[6] if len(sys.argv) > 6 else None
    load = lambda f: json.load(open(f))
    picture = load(picture_file)
    want = expected(load(pods), load(resources), load(slices), picture)
    page = Page()
    page.feed(open(dom_file).read())
    got = {k: v for k, v in page.boxes.items() if v}
    failed = False
    if got != want:
        print(f"page shows {got}\nget pods places {want}", file=sys.stderr)
        failed = True
    if f"generation {picture['generation']}" not in page.status:
        print(f"the script did not update the page: status {page.status!r}, "
              f"generation {picture['generation']}", file=sys.stderr)
        failed = True
    if hostile:
        shown = any(hostile.split("/", 1)[-1] in p for pods in got.values() for p in pods)
        if not shown:
            print(f"the hostile pod {hostile!r} is not shown as text", file=sys.stderr)
            failed = True
        injected = [t for t in page.tags if t[0] in ("img", "script") and t[1].get("src") == "x"
                    or any(k.startswith("on") for k in t[1])]
        scripts = [t for t in page.tags if t[0] == "script"]
        if len(scripts) != 1:
            injected += scripts
        if injected:
            print(f"markup injected by a pod name: {injected}", file=sys.stderr)
            failed = True
    if failed:
        sys.exit(1)
    for box in sorted(got):
        print(f"  NUMA {box}: {', '.join(sorted(got[box]))}")


if __name__ == "__main__":
    main()
