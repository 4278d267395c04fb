#!/bin/sh
# One hospital's export of the UCI heart-disease data (no header, 14 columns,
# `?` for missing) as the CSV that schema.json reads: a header line naming the
# columns, then the rows as exported. (Cleveland writes whole numbers as 1.0,
# the other three hospitals as 1: the schema compares categorical levels that
# read as numbers as numbers, so cp's 4.0 and 4 are one level.)
#
#   ./prepare.sh processed.cleveland.data > patients.csv
set -eu
if [ $# -ne 1 ]; then
	echo "usage: $0 EXPORT.data > patients.csv" >&2
	exit 2
fi
echo 'age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,num'
cat "$1"
