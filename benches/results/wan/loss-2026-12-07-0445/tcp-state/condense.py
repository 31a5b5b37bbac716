import re,sys
# Condenses a WAN_DIAG file: per sample, each agent-link socket's TCP state
# (sender side: BBR's bandwidth estimate and gains, cwnd, receive-window-
# limited time, unsent bytes; receiver side: autotuned receive space) and the
# tunnels' window growth at server (S) and agent (A).
for line in open(sys.argv[1]):
    if line.startswith('==='): print(line.strip()); continue
    m=re.match(r'--- t=(\S+)',line)
    if m: t=m.group(1); sect=None; continue
    if 'cloud ss' in line: sect='cloud'; continue
    if 'edge ss' in line: sect='edge'; continue
    if line.strip().startswith('server:'): sect='S'; continue
    if line.strip().startswith('agent:'): sect='A'; continue
    m=re.match(r'^(\d+)\s+(\d+)\s+(\S+)\s+(\S+)',line)
    if m and sect in ('cloud','edge'): q=(m.group(1),m.group(2),m.group(3).split(':')[1]); continue
    if line.startswith('\t') and sect in ('cloud','edge'):
        f=dict(re.findall(r'(\w+):([\d./]+\w*)',line))
        sent=int(f.get('bytes_acked','0')); rec=int(f.get('bytes_received','0'))
        if max(sent,rec)<1000000: continue
        bbr=re.search(r'bbr:\(bw:(\d+)bps,mrtt:[\d.]+,pacing_gain:([\d.]+),cwnd_gain:([\d.]+)\)',line)
        if sent>rec:
            bw=int(bbr.group(1))/8e6 if bbr else 0
            mode='startup' if bbr and bbr.group(2).startswith('2.88') else ('probe_bw' if bbr else '?')
            rl=re.search(r'rwnd_limited:(\d+)ms',line)
            print(f"{t:>5} {sect:5} port {q[2]:>5} SEND acked={sent/1e6:8.1f}MB rtt={f['rtt'].split('/')[0]:>7} cwnd={f.get('cwnd'):>6} bbr_bw={bw:6.2f}MB/s {mode:8} rwnd_limited={rl.group(1) if rl else 0}ms notsent={int(f.get('notsent','0'))/1e6:.1f}MB sendq={int(q[1])/1e6:.1f}MB retrans={f.get('retrans','0/0')}")
        else:
            print(f"{t:>5} {sect:5} port {q[2]:>5} RECV received={rec/1e6:8.1f}MB rcv_space={int(f.get('rcv_space','0'))/1e6:.2f}MB rcv_ssthresh={int(f.get('rcv_ssthresh','0'))/1e6:.2f}MB recvq={int(q[0])/1e6:.1f}MB")
    elif sect in ('S','A') and 'tunnel_window_growth_bytes' in line:
        print(f"{t:>5} {'server' if sect=='S' else 'agent':6} tunnel window growth {float(line.split()[-1])/2**20:.0f} MiB")
