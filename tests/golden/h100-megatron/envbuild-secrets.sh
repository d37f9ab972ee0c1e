# Sourced at the start of RUN steps: points pip, requests and apt at the CA bundle and pip.conf
# passed as BuildKit secrets (docker build --secret id=ca_cert,src=... --secret id=pip_conf,src=...).
# Secrets are tmpfs mounts under /run/secrets for one RUN step; nothing of them lands in a layer.
if [ -s /run/secrets/ca_cert ]; then
  export PIP_CERT=/run/secrets/ca_cert SSL_CERT_FILE=/run/secrets/ca_cert REQUESTS_CA_BUNDLE=/run/secrets/ca_cert
  export APT_CA_OPT="-o Acquire::https::CAInfo=/run/secrets/ca_cert"
else
  export APT_CA_OPT=""
fi
if [ -s /run/secrets/pip_conf ]; then
  export PIP_CONFIG_FILE=/run/secrets/pip_conf
fi
# A mirror's endpoints that carry credentials (envbuild build writes this file: `export VAR='...'`
# lines for PIP_INDEX_URL, TORCH_INDEX_URL, APT_MIRROR, APEX_URL, FLASH_ATTN_RELEASE): they override
# the credential-free ARG defaults for this step only and never reach a layer or `docker history`.
if [ -s /run/secrets/endpoints ]; then
  . /run/secrets/endpoints
fi
