#!/usr/bin/env python3
"""Minimal ANP server in Python, only for self-testing the interop peers (selftest.sh).

AgentService/Connect on --agent-listen (mTLS, client cert required) and
ProxyService/Proxy on --frontend (insecure; 'unix:/path' or HOST:PORT). Routes DIAL_REQ
from clients to the most recently connected agent, DIAL_RSP back by `random`, and
DATA / CLOSE_REQ / CLOSE_RSP by connectID. No agent -> DIAL_RSP error
"No agent available". Serves until --timeout, then prints 'OK ...' and exits 0.
Prints 'LISTENING agent_port=N' once both listeners are up.

This is a test fixture, not a reference implementation: no DRAIN, no DIAL_CLS
timeouts, no multi-agent balancing, no cleanup of a client's connections on stream end
beyond sending CLOSE_REQ for them.
"""

import argparse
import os
import sys
import threading
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anp_common as c  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent-listen", required=True, help="HOST:PORT for agents (port 0 = pick)")
    p.add_argument("--frontend", required=True, help="'unix:/path' or HOST:PORT for proxy clients")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--server-id", default="mini-server")
    p.add_argument("--frontend-mtls", action="store_true",
                   help="serve the frontend with the same mTLS credentials instead of insecure")
    c.add_common_args(p)
    a = p.parse_args()
    pb, pb_grpc, agent_grpc = c.load_stubs(a.gen_dir)
    import grpc
    P = c.Packets(pb)

    lock = threading.Lock()
    agents = []     # list of SendQueue, newest last
    pending = {}    # random -> (client SendQueue, agent SendQueue)
    conns = {}      # (id(agent sendq), connectID) -> client SendQueue
    stats = {"dials": 0, "agents": 0, "clients": 0}
    stopped = threading.Event()

    class AgentSvc(agent_grpc.AgentServiceServicer):
        def Connect(self, request_iterator, context):
            md = context.invocation_metadata()
            c.out("AGENT id=%s identifiers=%s" % (c.md_get(md, "agentid"), c.md_get(md, "agentidentifiers")))
            context.send_initial_metadata((("serverid", a.server_id), ("servercount", "1")))
            sendq = c.SendQueue(a.verbose, "to-agent")
            with lock:
                agents.append(sendq)
                stats["agents"] += 1

            def pump():
                try:
                    for pkt in request_iterator:
                        with lock:
                            if pkt.type == P.DIAL_RSP:
                                cq, _ = pending.pop(pkt.dialResponse.random, (None, None))
                                if cq is not None and not pkt.dialResponse.error:
                                    conns[(id(sendq), pkt.dialResponse.connectID)] = cq
                            elif pkt.type == P.DATA:
                                cq = conns.get((id(sendq), pkt.data.connectID))
                            elif pkt.type == P.CLOSE_RSP:
                                cq = conns.pop((id(sendq), pkt.closeResponse.connectID), None)
                            else:
                                cq = None
                        if cq is None:
                            c.log("agent packet not routable: %s" % c.describe(pkt))
                        else:
                            cq.put(pkt)
                except grpc.RpcError as e:
                    c.log("agent stream error: %s" % c.rpc_error_text(e))
                with lock:
                    if sendq in agents:
                        agents.remove(sendq)
                sendq.close()

            threading.Thread(target=pump, daemon=True).start()
            for pkt in sendq:
                yield pkt

    class ProxySvc(pb_grpc.ProxyServiceServicer):
        def Proxy(self, request_iterator, context):
            sendq = c.SendQueue(a.verbose, "to-client")
            mine = set()  # (agent sendq, connectID) dialled by this client
            with lock:
                stats["clients"] += 1

            def pump():
                try:
                    for pkt in request_iterator:
                        if pkt.type == P.DIAL_REQ:
                            with lock:
                                agent = agents[-1] if agents else None
                                if agent is not None:
                                    pending[pkt.dialRequest.random] = (sendq, agent)
                                    stats["dials"] += 1
                            if agent is None:
                                sendq.put(P.dial_rsp(pkt.dialRequest.random, 0, "No agent available"))
                            else:
                                agent.put(pkt)
                            continue
                        if pkt.type == P.DATA:
                            cid = pkt.data.connectID
                        elif pkt.type == P.CLOSE_REQ:
                            cid = pkt.closeRequest.connectID
                        else:
                            c.log("client packet ignored: %s" % c.describe(pkt))
                            continue
                        with lock:
                            agent = next((q for q in agents if conns.get((id(q), cid)) is sendq), None)
                            if agent is not None:
                                mine.add((agent, cid))
                        if agent is None:
                            if pkt.type == P.CLOSE_REQ:
                                sendq.put(P.close_rsp(cid, "unknown connectID"))
                            continue
                        agent.put(pkt)
                except grpc.RpcError as e:
                    c.log("client stream error: %s" % c.rpc_error_text(e))
                # Client went away: close what it left open, then end its stream.
                with lock:
                    leftover = [(ag, cid) for ag, cid in mine if conns.get((id(ag), cid)) is sendq]
                for ag, cid in leftover:
                    ag.put(P.close_req(cid))
                sendq.close()

            threading.Thread(target=pump, daemon=True).start()
            for pkt in sendq:
                yield pkt

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=list(c.GRPC_OPTIONS))
    agent_grpc.add_AgentServiceServicer_to_server(AgentSvc(), server)
    pb_grpc.add_ProxyServiceServicer_to_server(ProxySvc(), server)
    creds = grpc.ssl_server_credentials(
        [(c.read_file(a.key, "key"), c.read_file(a.cert, "cert"))],
        root_certificates=c.read_file(a.ca, "CA"), require_client_auth=True)
    port = server.add_secure_port(a.agent_listen, creds)
    fport = server.add_secure_port(a.frontend, creds) if a.frontend_mtls else server.add_insecure_port(a.frontend)
    if not port or not fport:
        c.fail("cannot listen on %s / %s" % (a.agent_listen, a.frontend), c.EXIT_USAGE)
    server.start()
    c.out("LISTENING agent_port=%d frontend_port=%d" % (port, fport))
    stopped.wait(a.timeout)
    server.stop(grace=0.5).wait(2)
    c.finish_ok("agents=%d clients=%d dials=%d" % (stats["agents"], stats["clients"], stats["dials"]))


if __name__ == "__main__":
    c.run_main(main)
