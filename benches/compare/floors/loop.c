// Loopback TCP floor: one sender process, one receiver process, N bytes in
// CHUNK writes/reads; prints each side's user and system CPU per GB.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
static double tv(struct timeval t){return t.tv_sec+t.tv_usec/1e6;}
int main(int argc,char**argv){
  long total=atol(argv[1]); int chunk=atoi(argv[2]);
  int l=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_addr.s_addr=htonl(0x7f000001);
  bind(l,(void*)&a,sizeof a); socklen_t al=sizeof a; getsockname(l,(void*)&a,&al); listen(l,1);
  int pfd[2]; pipe(pfd);
  pid_t c=fork();
  if(c==0){ int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a);
    char*b=malloc(chunk); memset(b,7,chunk); long left=total;
    while(left>0){ long n=write(s,b,left<chunk?left:chunk); if(n<=0){perror("w");exit(1);} left-=n;}
    close(s); struct rusage ru; getrusage(RUSAGE_SELF,&ru);
    printf("send: user %.3f sys %.3f s/GB\n",tv(ru.ru_utime)/(total/1e9),tv(ru.ru_stime)/(total/1e9)); exit(0);}
  int s=accept(l,0,0); char*b=malloc(chunk); long got=0; long n;
  while((n=read(s,b,chunk))>0) got+=n;
  struct rusage ru; getrusage(RUSAGE_SELF,&ru); waitpid(c,0,0);
  printf("recv: user %.3f sys %.3f s/GB (%ld bytes)\n",tv(ru.ru_utime)/(got/1e9),tv(ru.ru_stime)/(got/1e9),got);
}
