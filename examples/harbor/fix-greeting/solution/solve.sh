#!/bin/bash
set -eu
printf '#!/bin/bash\necho "Hello, $1!"\n' > /srv/greet/greet.sh
