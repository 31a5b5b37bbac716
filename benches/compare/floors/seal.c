// What sealing in place would save (issue 29): CPU per GB of sealing 16 KiB
// TLS records with AES-128-GCM (OpenSSL's EVP, the same VAES/AVX2 family of
// code as ring's) when the payload is (a) copied into a fresh buffer first,
// as rustls does, or (b) sealed in place; each with the payload hot (one
// 16 KiB buffer) or cold (walking a 64 MiB ring of payload, far beyond L2
// and L3, as payload that waited in queues).
//   gcc -O2 -o seal seal.c -lcrypto && ./seal
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define REC 16384
static double cpu(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec/1e9;}
static EVP_CIPHER_CTX *ctx; static unsigned char key[16], iv[12], tag[16];
static void seal(unsigned char *p){int n;
  EVP_EncryptInit_ex(ctx,NULL,NULL,NULL,iv);
  EVP_EncryptUpdate(ctx,NULL,&n,(unsigned char*)"hdr05",5);
  EVP_EncryptUpdate(ctx,p,&n,p,REC); EVP_EncryptFinal_ex(ctx,p+n,&n);
  EVP_CIPHER_CTX_ctrl(ctx,EVP_CTRL_GCM_GET_TAG,16,tag);}
int main(void){
  ctx=EVP_CIPHER_CTX_new(); EVP_EncryptInit_ex(ctx,EVP_aes_128_gcm(),NULL,key,iv);
  size_t ring=64<<20; unsigned char *src=malloc(ring); memset(src,3,ring);
  long recs=(4L<<30)/REC; // 4 GiB per case
  for(int cold=0;cold<2;cold++) for(int copy=1;copy>=0;copy--){
    double t0=cpu(); size_t off=0;
    for(long i=0;i<recs;i++){
      unsigned char *p=src+(cold?off:0); off=(off+REC)%ring;
      if(copy){unsigned char *d=malloc(REC+22); memcpy(d+5,p,REC); seal(d+5); free(d);}
      else seal(p);
    }
    double s=cpu()-t0;
    printf("%s payload, %s: %.3f s/GB\n",cold?"cold":"hot ",copy?"copy into a fresh buffer, then seal":"seal in place",s/((double)recs*REC/1e9));
  }
}
