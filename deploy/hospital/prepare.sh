#!/bin/sh
# One hospital's export of the UCI heart-disease data (no header, 14 columns,
# `?` for missing) as the CSV that schema.json reads: a header line naming the
# columns, then the rows, with whole numbers written as Cleveland's export
# does not (1.0 -> 1, as the other three hospitals write them), so that a
# category such as cp is spelled the same at every site.
#
#   ./prepare.sh processed.cleveland.data > patients.csv
set -eu
if [ $# -ne 1 ]; then
	echo "usage: $0 EXPORT.data > patients.csv" >&2
	exit 2
fi
echo 'age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,num'
sed -E 's/\.0(,|$)/\1/g' "$1"
