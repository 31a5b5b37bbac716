// Request/response floor: one epoll echo server process, one epoll client
// process with C connections in closed loop, 1 KiB each way; prints the
// server's CPU per request (one recv + one send of 1 KiB, plus epoll).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#define C 16
#define SZ 1024
static double tv(struct timeval t){return t.tv_sec+t.tv_usec/1e6;}
static double now(){struct timeval t;gettimeofday(&t,0);return tv(t);}
int main(int argc,char**argv){
  double secs=atof(argv[1]);
  int l=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_addr.s_addr=htonl(0x7f000001);
  bind(l,(void*)&a,sizeof a); socklen_t al=sizeof a; getsockname(l,(void*)&a,&al); listen(l,64);
  pid_t c=fork();
  if(c==0){ int ep=epoll_create1(0); char b[SZ]; memset(b,1,SZ); int one=1;
    for(int i=0;i<C;i++){int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a); setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4);
      struct epoll_event e={.events=EPOLLIN,.data.fd=s}; epoll_ctl(ep,EPOLL_CTL_ADD,s,&e); write(s,b,SZ);}
    struct epoll_event ev[C]; for(;;){int n=epoll_wait(ep,ev,C,-1); for(int i=0;i<n;i++){int s=ev[i].data.fd; int r=read(s,b,SZ); if(r<=0) exit(0); write(s,b,r);}}}
  int ep=epoll_create1(0); int one=1;
  for(int i=0;i<C;i++){int s=accept(l,0,0); setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4); struct epoll_event e={.events=EPOLLIN,.data.fd=s}; epoll_ctl(ep,EPOLL_CTL_ADD,s,&e);}
  char b[SZ]; long reqs=0; struct rusage r0,r1; getrusage(RUSAGE_SELF,&r0); double t0=now();
  struct epoll_event ev[C];
  while(now()-t0<secs){int n=epoll_wait(ep,ev,C,-1); for(int i=0;i<n;i++){int s=ev[i].data.fd; int r=read(s,b,SZ); if(r>0){write(s,b,r); reqs++;}}}
  getrusage(RUSAGE_SELF,&r1); kill(c,SIGKILL); waitpid(c,0,0);
  double u=tv(r1.ru_utime)-tv(r0.ru_utime), k=tv(r1.ru_stime)-tv(r0.ru_stime);
  printf("echo server: %ld req in %.1fs: user %.2f kernel %.2f total %.2f us/req\n",reqs,secs,u/reqs*1e6,k/reqs*1e6,(u+k)/reqs*1e6);
}
