#!/usr/bin/env python3
"""Who calls memcpy/memmove in a `perf record --call-graph dwarf` profile
(issue 29): the share of all samples whose leaf is memmove/memcpy, split
by the first known caller on the stack (the copies of the data path).

    benches/compare/profile_memcpy.py FILE.data...
"""
import subprocess, sys, re, collections
pats=[("ReadAhead -> rustls deframer","ReadAhead"),
      ("gRPC frame reassembly (FrameDecoder::copy_out)","FrameDecoder"),
      ("rustls: plaintext into the record buffer (encrypt)","OutboundChunks::copy_to_vec"),
      ("rustls read side: record into its plaintext queue, then out to the reader","tokio_rustls::.*poll_read"),
      ("rustls deframer (discard/compact)","deframer"),
      ("gRPC frame reassembly (FrameDecoder::copy_out)","FrameDecoder"),
      ("h2 crate","^h2::"),
      ("our h2 / grpc / packets","h2_conn|h2_server|engine::grpc|protocol::"),
      ("relay","relay::"),]
for f in sys.argv[1:]:
    out=subprocess.run(["perf","script","-i",f,"-F","period,ip,sym"],capture_output=True,text=True).stdout
    tot=0; mm=0; by=collections.Counter()
    for b in out.split("\n\n"):
        ls=[l.strip() for l in b.strip().splitlines() if l.strip()]
        if len(ls)<2: continue
        p=int(ls[0].split()[0]); tot+=p
        fr=[re.sub(r"^[0-9a-f]+\s+","",l) for l in ls[1:]]
        if not re.search("memmove|memcpy",fr[0]): continue
        mm+=p
        for name,pat in pats:
            if any(re.search(pat,x) for x in fr[1:]):
                by[name]+=p; break
        else: by["other"]+=p
    print(f"{f}: memcpy {100*mm/tot:.1f}% of samples")
    for k,v in by.most_common(): print(f"   {k}: {100*v/tot:.1f}%")
